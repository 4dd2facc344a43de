"""Wheel staging for the GPU machine (qrewrite/wheel_stage.py): split -> carry -> gather -> reassemble -> install.

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

from qrewrite import wheel_stage as ws

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
    big = next(w for w in m["wheels"] if w["file"].startswith("big-"))
    assert len(big["pieces"]) == 4 and big["pieces"][0].endswith(".part000")
    assert {w["file"] for w in m["wheels"]} == {p.name for p in wheels.iterdir()}
    for w in m["wheels"]:
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
    assert len(out) == len(m["wheels"])
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
    _wheel(src, "padding-1.0-py3-none-any.whl", int(1.5 * MIB), 5)  # forces pieces; not installable, removed below
    assert ws.main(["split", str(src), str(tmp_path / "stage"), "--max-mib", "1"]) == 0
    assert "chunks" in capsys.readouterr().out
    # keep only the real wheel in the manifest so pip gets installable files
    for mf in (tmp_path / "stage").rglob("manifest.json"):
        m = json.loads(mf.read_text())
        m["wheels"] = [w for w in m["wheels"] if w["file"].startswith("qrwstagedemo")]
        m["pieces"] = [p for p in m["pieces"] if p["wheel"].startswith("qrwstagedemo")]
        mf.write_text(json.dumps(m))
    target = tmp_path / "site"
    assert ws.main(["install", str(tmp_path / "stage"), "--target", str(target)]) == 0
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
    report = _report(("torch", "2.11.0"), ("nvidia-cublas", "13.1"), ("vllm", "0.24.0"),
                     ("transformers", "5.9.0"), ("numpy", "2.5.2"), ("Huggingface_Hub", "1.33.0"))
    plan = ws.make_plan(report, ["jieba==0.42.1"],
                        have={"transformers": "5.17.0", "numpy": "2.5.2", "huggingface-hub": None})
    carried = {(w["name"], w["version"]) for w in plan["wheels"]}
    assert carried == {("vllm", "0.24.0"), ("transformers", "5.9.0")}  # image's 5.17.0 is not verl's pin
    assert {s["name"] for s in plan["skipped"]} == {"torch", "nvidia-cublas", "numpy", "huggingface-hub"}
    assert plan["build"] == ["jieba==0.42.1"]
    assert next(w for w in plan["wheels"] if w["name"] == "transformers")["image_version"] == "5.17.0"


def test_resolve_takes_out_sdist_only_pins_and_retries(tmp_path):
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        reqs = Path(argv[argv.index("-r") + 1]).read_text().split()
        assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.12"
        if "jieba==0.42.1" in reqs:
            return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found for jieba==0.42.1")
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(_report(("vllm", "0.24.0"))))
        return SimpleNamespace(returncode=0, stderr="")

    report, sdist = ws.resolve(["vllm==0.24.0", "jieba==0.42.1"], run=run)
    assert sdist == ["jieba==0.42.1"] and len(calls) == 2
    assert report["install"][0]["metadata"]["name"] == "vllm"

    def conflict(argv, **kw):
        return SimpleNamespace(returncode=1, stderr="ERROR: ResolutionImpossible: torch==2.11.0 vs torch==2.13.0")

    with pytest.raises(ws.StageError, match="ResolutionImpossible"):
        ws.resolve(["torch==2.11.0"], run=conflict)


def test_read_pins_keeps_order_and_drops_comments(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("# c\nvllm==0.24.0  # vLLM\n\ntorch==2.11.0\n")
    b.write_text("torch==2.11.0\nverl==0.9.1\n")
    assert ws.read_pins([a, b]) == ["vllm==0.24.0", "torch==2.11.0", "verl==0.9.1"]
    b.write_text("-e .\n")
    with pytest.raises(ws.StageError, match="not supported"):
        ws.read_pins([b])
