"""Wheel staging for the GPU machine (tools/gpukit/wheel_stage.py): split -> carry -> gather -> reassemble -> install.

No network: wheels are made here (random bytes for the byte-level round trip, one real minimal wheel that pip
installs with --no-index --target). The pip resolution is exercised through a scripted runner, since it needs PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.gpukit import wheel_stage as ws

MIB = 1024 * 1024


def _wheel(folder: Path, name: str, size: int, seed: int) -> Path:
    path = folder / name
    path.write_bytes(random.Random(seed).randbytes(size))  # seeded: a failure reproduces
    return path


@pytest.fixture
def wheels(tmp_path) -> Path:
    src = tmp_path / "wheels"
    src.mkdir()
    _wheel(src, "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", int(2.6 * MIB), 1)
    _wheel(src, "mid-2.0-py3-none-any.whl", int(0.5 * MIB), 2)
    _wheel(src, "small-0.1-py3-none-any.whl", 5000, 3)
    _wheel(src, "tiny-0.2-py3-none-any.whl", 40, 4)
    return src


def test_split_round_trip_keeps_every_byte_and_the_chunk_limit(wheels, tmp_path):
    stage = tmp_path / "stage"
    m = ws.split(wheels, stage, max_mib=1)
    assert len(m["chunks"]) >= 4 and m["chunks"][0] == "chunk-00"
    for c in m["chunks"]:  # the carry limit holds for each folder, its manifest copy included
        assert sum(f.stat().st_size for f in (stage / c).iterdir()) <= 1 * MIB
        assert json.loads((stage / c / "manifest.json").read_text()) == m
    big = next(w for w in m["files"] if w["file"].startswith("big-"))
    assert len(big["pieces"]) == 4 and big["pieces"][0].endswith(".part000")
    assert {w["file"] for w in m["files"]} == {p.name for p in wheels.iterdir()}
    for w in m["files"]:
        assert w["sha256"] == ws.sha256_file(wheels / w["file"])
    for p in m["pieces"]:
        assert p["sha256"] == ws.sha256_file(stage / p["chunk"] / p["file"])
    out = ws.reassemble(stage, tmp_path / "out")
    assert sorted(p.name for p in out) == sorted(p.name for p in wheels.iterdir())
    for p in out:
        assert p.read_bytes() == (wheels / p.name).read_bytes()


def test_corrupted_piece_is_named(wheels, tmp_path):
    stage = tmp_path / "stage"
    m = ws.split(wheels, stage, max_mib=1)
    piece = next(p for p in m["pieces"] if p["file"].endswith(".part002"))
    path = stage / piece["chunk"] / piece["file"]
    data = bytearray(path.read_bytes())
    data[1234] ^= 0xFF  # same size, one bit pattern changed
    path.write_bytes(bytes(data))
    with pytest.raises(ws.StageError, match=rf"piece {piece['chunk']}/{piece['file']} is corrupt") as e:
        ws.reassemble(stage, tmp_path / "out")
    assert f"carry {piece['chunk']} again" in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    with pytest.raises(ws.StageError, match="is corrupt"):
        ws.verify_chunk(stage / piece["chunk"])


def test_missing_chunk_is_named(wheels, tmp_path):
    stage = tmp_path / "stage"
    m = ws.split(wheels, stage, max_mib=1)
    shutil.rmtree(stage / m["chunks"][1])
    (stage / "manifest.json").unlink()  # the manifest is read from any chunk that is there
    with pytest.raises(ws.StageError, match=rf"missing chunk folder\(s\) under .*: {m['chunks'][1]} "):
        ws.reassemble(stage, tmp_path / "out")


def test_gather_checks_each_carried_chunk_then_reassembles(wheels, tmp_path):
    stage, dest = tmp_path / "stage", tmp_path / "device-stage"
    m = ws.split(wheels, stage, max_mib=1)
    for c in m["chunks"]:  # one device call per chunk
        assert ws.gather(stage / c, dest) == dest / c
    out = ws.reassemble(dest, tmp_path / "out")
    assert len(out) == len(m["files"])
    victim = next(p for p in m["pieces"] if p["chunk"] == "chunk-00")
    (stage / "chunk-00" / victim["file"]).write_bytes(b"truncated")
    with pytest.raises(ws.StageError, match=f"piece chunk-00/{victim['file']} is corrupt"):
        ws.gather(stage / "chunk-00", tmp_path / "other")
    assert not (tmp_path / "other" / "chunk-00").exists()


def _real_wheel(folder: Path) -> Path:
    """A minimal valid wheel (PEP 427) of package qrwstagedemo, written by hand."""
    files = {"qrwstagedemo/__init__.py": b"VALUE = 42\n",
             "qrwstagedemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: qrwstagedemo\nVersion: 1.0\n",
             "qrwstagedemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                 b"Tag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for n, d in files.items()) + "qrwstagedemo-1.0.dist-info/RECORD,,\n"
    path = folder / "qrwstagedemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("qrwstagedemo-1.0.dist-info/RECORD", record)
    return path


def test_cli_split_install_runs_pip_offline_into_target(tmp_path, capsys):
    src = tmp_path / "wheels"
    src.mkdir()
    _real_wheel(src)
    gguf = _wheel(src, "model.gguf", int(1.5 * MIB), 5)  # a file that is no wheel rides along in pieces
    assert ws.main(["split", str(src), str(tmp_path / "stage"), "--max-mib", "1"]) == 0
    assert "chunks" in capsys.readouterr().out
    target = tmp_path / "site"
    assert ws.main(["install", str(tmp_path / "stage"), "--target", str(target)]) == 2
    assert "pass --files-to" in capsys.readouterr().err
    assert ws.main(["install", str(tmp_path / "stage"), "--target", str(target), "--files-to",
                    str(tmp_path / "files")]) == 0
    assert (tmp_path / "files" / "model.gguf").read_bytes() == gguf.read_bytes()
    proc = subprocess.run([sys.executable, "-c", "import qrwstagedemo; print(qrwstagedemo.VALUE)"],
                          env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert proc.stdout.strip() == "42", proc.stderr


def test_cli_reports_a_bad_piece_with_exit_2(wheels, tmp_path, capsys):
    stage = tmp_path / "stage"
    m = ws.split(wheels, stage, max_mib=1)
    p = m["pieces"][0]
    (stage / p["chunk"] / p["file"]).write_bytes(b"x")
    assert ws.main(["install", str(stage), "--target", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert f"piece {p['chunk']}/{p['file']} is corrupt" in err and not (tmp_path / "site").exists()


def _report(*items):
    return {"install": [{"metadata": {"name": n, "version": v},
                         "download_info": {"url": f"https://files.example/{n}-{v}-py3-none-any.whl",
                                           "archive_info": {"hashes": {"sha256": "ab" * 32}}}}
                        for n, v in items]}


def test_plan_leaves_out_the_torch_stack_and_what_the_image_has():
    report = _report(("torch", "2.11.0"), ("cuda-toolkit", "13.0.2"), ("nvidia-cublas", "13.1"),
                     ("nvidia-cuda-nvcc", "13.2"), ("nvidia-cutlass-dsl", "4.5.2"), ("vllm", "0.24.0"),
                     ("transformers", "5.9.0"), ("numpy", "2.5.2"), ("Huggingface_Hub", "1.33.0"), ("wandb", "0.31.0"))
    meta = {i["metadata"]["name"]: i["metadata"] for i in report["install"]}
    # torch 2.11's shape: CUDA libraries through cuda-toolkit's extras, not named directly
    meta["torch"]["requires_dist"] = ['cuda-toolkit[cublas]==13.0.2; platform_system == "Linux"', "sympy>=1.13.3",
                                      'opt-einsum>=3.3; extra == "opt-einsum"']
    meta["cuda-toolkit"]["requires_dist"] = ['nvidia-cublas==13.1.*; extra == "cublas"',
                                             'nvidia-cuda-nvcc==13.0.*; extra == "nvcc"']
    plan = ws.make_plan(report, exclude=["wandb"],
                        have={"transformers": "5.17.0", "numpy": "2.5.2", "huggingface-hub": None})
    carried = {(w["name"], w["version"]) for w in plan["wheels"]}
    # image's transformers 5.17.0 is not verl's pin; cutlass-dsl (vLLM's) and nvcc (an extra torch did not ask
    # for) are not torch's, so they travel
    assert carried == {("vllm", "0.24.0"), ("transformers", "5.9.0"), ("nvidia-cutlass-dsl", "4.5.2"),
                       ("nvidia-cuda-nvcc", "13.2")}
    assert {s["name"] for s in plan["skipped"]} == {"torch", "cuda-toolkit", "nvidia-cublas", "numpy",
                                                    "huggingface-hub", "wandb"}
    assert next(w for w in plan["wheels"] if w["name"] == "transformers")["image_version"] == "5.17.0"


def test_resolve_builds_sdist_only_pins_and_resolves_against_them(tmp_path):
    """jieba has no wheel: it is built here, and the retried resolution finds it through --find-links (so a
    package that depends on it resolves too); download then copies it instead of fetching it."""
    calls, build = [], tmp_path / "built"

    def run(argv, **kw):
        calls.append(argv)
        if argv[3] == "wheel":  # pip wheel --no-deps --no-binary jieba -w DIR jieba==0.42.1
            assert argv[argv.index("--no-binary") + 1] == "jieba"
            (Path(argv[argv.index("-w") + 1]) / "jieba-0.42.1-py3-none-any.whl").write_bytes(b"jieba wheel")
            return SimpleNamespace(returncode=0)
        assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.12"
        assert argv[argv.index("--find-links") + 1] == str(build)
        if not (build / "jieba-0.42.1-py3-none-any.whl").exists():
            return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found for jieba==0.42.1")
        report = _report(("vllm", "0.24.0"))
        report["install"].append({"metadata": {"name": "jieba", "version": "0.42.1"},
                                  "download_info": {"url": f"file://{build}/jieba-0.42.1-py3-none-any.whl"}})
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(report))
        return SimpleNamespace(returncode=0, stderr="")

    report = ws.resolve(["vllm==0.24.0", "jieba==0.42.1"], build, run=run)
    assert [c[3] for c in calls] == ["install", "wheel", "install"]
    plan = ws.make_plan(report, build_dir=build)
    jieba = next(w for w in plan["wheels"] if w["name"] == "jieba")
    assert jieba["built_here"] and jieba["sha256"] == hashlib.sha256(b"jieba wheel").hexdigest()
    assert not next(w for w in plan["wheels"] if w["name"] == "vllm")["local"]

    def fetch(argv, **kw):  # pip download: only the wheels that exist on the index
        assert argv[3] == "download" and argv[-1] == "vllm==0.24.0"
        return SimpleNamespace(returncode=0)

    with pytest.raises(ws.StageError, match="vllm-0.24.0-py3-none-any.whl was not downloaded"):
        ws.download(plan, tmp_path / "dl", run=fetch)
    assert (tmp_path / "dl" / "jieba-0.42.1-py3-none-any.whl").read_bytes() == b"jieba wheel"


def test_resolve_reports_a_real_conflict(tmp_path):
    def conflict(argv, **kw):
        return SimpleNamespace(returncode=1, stderr="ERROR: ResolutionImpossible: torch==2.11.0 vs torch==2.13.0")

    with pytest.raises(ws.StageError, match="ResolutionImpossible"):
        ws.resolve(["torch==2.11.0"], tmp_path, run=conflict)

    def compiled(argv, **kw):  # a pin whose sdist builds a CPython-3.11 extension here would not fit 3.12
        if argv[3] == "wheel":
            (Path(argv[argv.index("-w") + 1]) / "fast-1.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"x")
            return SimpleNamespace(returncode=0)
        return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found for fast==1.0")

    with pytest.raises(ws.StageError, match="pure-Python"):
        ws.resolve(["fast==1.0"], tmp_path / "b", run=compiled)


def test_read_pins_keeps_order_and_drops_comments(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("# c\nvllm==0.24.0  # vLLM\n\ntorch==2.11.0\n")
    b.write_text("torch==2.11.0\nverl==0.9.1\n")
    assert ws.read_pins([a, b]) == ["vllm==0.24.0", "torch==2.11.0", "verl==0.9.1"]
    b.write_text("-e .\n")
    with pytest.raises(ws.StageError, match="not supported"):
        ws.read_pins([b])


def test_cli_plan_unpins_what_the_gpu_set_cannot_meet(tmp_path, monkeypatch, capsys):
    reqs = tmp_path / "verl.txt"
    reqs.write_text("numpy==2.4.6\nverl==0.9.1\n")
    seen = {}

    def fake_resolve(pins, build_dir, **kw):
        seen["pins"] = list(pins)
        return _report(("verl", "0.9.1"), ("numpy", "2.3.5"))

    monkeypatch.setattr(ws, "resolve", fake_resolve)
    out = tmp_path / "plan.json"
    assert ws.main(["plan", "-r", str(reqs), "--unpin", "NumPy", "--out", str(out)]) == 0
    assert seen["pins"] == ["verl==0.9.1"]  # the resolver picks numpy itself
    assert {w["name"] for w in json.loads(out.read_text())["wheels"]} == {"verl", "numpy"}
    assert "carry  numpy==2.3.5" in capsys.readouterr().out
    # replanning from the saved report resolves nothing
    monkeypatch.setattr(ws, "resolve", lambda *a, **k: pytest.fail("resolved again"))
    assert ws.main(["plan", "-r", str(reqs), "--from-report", str(tmp_path / "plan.report.json"), "--exclude", "numpy",
                    "--out", str(out)]) == 0
    assert {w["name"] for w in json.loads(out.read_text())["wheels"]} == {"verl"}
