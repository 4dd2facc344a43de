"""The learning run's policy on the device: the pipeline's SFT student rebuilt from what the kit carries.

The kit carries the base GGUF (491 MB, Q4_K_M) and the SFT stage's LoRA adapter (~17 MB), not the merged float32
folder (~2 GB, 35 calls): here the GGUF becomes models/base with the pipeline's own conversion
(`qrewrite.training.base_model.convert.convert_gguf`, tied embeddings, as the base_model rule does) and the adapter
is merged with peft (`merge_and_unload`, what `swift export --merge_lora` does under the hood). `reference` then
proves it is the same student: the first rows of the test split, rewritten by the eval's own generation
(`runtime.generate.generate_rewrites`, float32), must equal what models/T/sft-merged wrote on the CPU at kit time.

  python -m tools.gpukit.student build --gguf G --adapter A --out DIR --base-dir B [--tenant-config C]
  python -m tools.gpukit.student reference --model DIR --tenant-config C --rows R.jsonl --out REF.json
  python -m tools.gpukit.student compare --model DIR --tenant-config C --reference REF.json --out CMP.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_dir, read_jsonl, write_json

REFERENCE_ROWS = 8  # rows rewritten at kit time (CPU) and again from the rebuilt student


def build(gguf: str | Path, adapter: str | Path, out: str | Path, *, base_dir: str | Path,
          layers: int | None = None) -> dict:
    """out <- base (converted from gguf into base_dir, kept for a rerun) with the adapter merged; timings.
    ``layers``: the kit config's base_model.layers (CI's kit cuts the base, .ci/gpu-kit.yaml): the base the adapter
    was trained on, or the reference check fails."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qrewrite.training.base_model.convert import conversion_matches, convert_gguf

    t0 = time.monotonic()
    base_dir, out = Path(base_dir), Path(out)
    converted = not conversion_matches(base_dir, layers=layers, tie=True)  # a base cut otherwise is converted again
    convert_gguf(base_dir, gguf_path=gguf, tie=True, layers=layers)
    t1 = time.monotonic()
    if not (Path(adapter) / "adapter_config.json").is_file():
        raise QrewriteError("no LoRA adapter (adapter_config.json)", file=str(adapter),
                            hint="the kit carries models/T/sft (the sft stage's adapter)")
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with atomic_dir(out) as tmp:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(tmp))
    return {"base_converted_here": converted, "layers": layers, "convert_s": round(t1 - t0, 1),
            "merge_s": round(time.monotonic() - t1, 1), "out": str(out)}


def tenant_from(config: str | Path) -> tuple[dict, dict]:
    """(cfg, its one tenant) of a learning-run config (the kit's config.yaml: one tenant, schema defaults filled)."""
    from qrewrite.config import load_config

    cfg = load_config(str(config))
    if len(cfg["tenants"]) != 1:
        raise QrewriteError(f"expected one tenant, found {[t['name'] for t in cfg['tenants']]}", file=str(config))
    return cfg, cfg["tenants"][0]


def rewrite(model: str | Path, cfg: dict, tenant: dict, rows: list[dict], *, device: str,
            dtype: str | None = None) -> dict[str, str]:
    """query id -> the eval's plain greedy rewrite (eval.generation's lengths and guards, no lever)."""
    from qrewrite.runtime.generate import generate_rewrites, generation_kwargs

    g = cfg["eval"]["generation"]
    # no copy bias: the check compares the student itself, without a decoding lever
    out, _ = generate_rewrites(str(model), tenant, rows,
                               **generation_kwargs(g, copy_bias=None, threads=None, device=device, dtype=dtype))
    return {r["query_id"]: r["rewrite"] for r in out}


def compare(ref: dict, got: dict[str, str]) -> dict:
    """Row by row: the rebuilt student's rewrites against the CPU reference's."""
    diff = [{"query_id": q, "cpu": t, "here": got.get(q)} for q, t in ref["rewrites"].items() if got.get(q) != t]
    return {"rows": len(ref["rewrites"]), "equal": len(ref["rewrites"]) - len(diff), "different": diff,
            "reference_made_by": ref.get("made_by")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.student", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="GGUF -> models/base, + the SFT adapter merged -> OUT")
    p.add_argument("--gguf", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--base-dir", required=True, help="the converted base (kept: a rerun does not convert again)")
    p.add_argument("--out", required=True)
    p.add_argument("--tenant-config", help="the learning run's config: its base_model.layers cuts the base as the "
                   "kit's sft stage did (none: every decoder block)")
    p.add_argument("--stats", help="JSON with the timings")
    for name in ("reference", "compare"):
        p = sub.add_parser(name, help="the CPU reference rewrites (kit time)" if name == "reference"
                           else "the rebuilt student against the reference")
        p.add_argument("--model", required=True)
        p.add_argument("--tenant-config", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--device", default="cpu")
        if name == "reference":
            p.add_argument("--rows", required=True, help="JSONL of eval rows (the kit's test split rows)")
        else:
            p.add_argument("--reference", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            layers = tenant_from(args.tenant_config)[0]["base_model"].get("layers") if args.tenant_config else None
            info = build(args.gguf, args.adapter, args.out, base_dir=args.base_dir, layers=layers)
            if args.stats:
                write_json(args.stats, info)
            print(json.dumps(info))
            return 0
        cfg, tenant = tenant_from(args.tenant_config)
        if args.cmd == "reference":
            rows = list(read_jsonl(args.rows))[:REFERENCE_ROWS]
            got = rewrite(args.model, cfg, tenant, rows, device=args.device, dtype="float32")
            write_json(args.out, {"made_by": str(args.model), "device": args.device, "dtype": "float32",
                                  "rows": rows, "rewrites": got})
            print(f"{len(got)} reference rewrites -> {args.out}")
            return 0
        ref = json.loads(Path(args.reference).read_text(encoding="utf-8"))
        got = rewrite(args.model, cfg, tenant, ref["rows"], device=args.device, dtype="float32")
        result = compare(ref, got)
        write_json(args.out, result)
        print(f"student vs the CPU reference: {result['equal']}/{result['rows']} rewrites equal")
        return 0 if result["equal"] == result["rows"] else 1
    except QrewriteError as e:
        print(f"student: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
