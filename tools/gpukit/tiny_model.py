"""The GPU check's policy: a randomly initialised 2-layer Qwen2 with the base model's real tokenizer.

It stands in for a tenant's merged SFT model (models/T/sft-merged), so the check carries 20 MB, not 1 GB: what
is checked is that verl trains, checkpoints, resumes and merges, not what the model learns. head_dim 64 (one head
of 64) is a size vLLM's FLASH_ATTN kernels and its LoRA kernels both take; the vocabulary is the base model's, so
every token id the tokenizer makes has a row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_dir

SHAPE = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 1,
         "num_key_value_heads": 1}


def make_tiny_model(base_dir: str | Path, out_dir: str | Path, *, seed: int = 0) -> dict:
    """out_dir <- tiny Qwen2 (bf16 safetensors, tied embeddings) + the tokenizer files of base_dir (a model folder,
    models/base for the kit; its config.json, where there is one, gives the vocabulary size and rope)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    base_dir = Path(base_dir)
    conf_path = base_dir / "config.json"
    base = json.loads(conf_path.read_text(encoding="utf-8")) if conf_path.is_file() else {}
    try:
        tok = AutoTokenizer.from_pretrained(base_dir)
    except (OSError, ValueError) as e:
        raise QrewriteError(f"no tokenizer in {base_dir}: {e}", hint="make models/base first (snakemake models/base)")
    rope = {"rope_parameters": base["rope_parameters"]} if "rope_parameters" in base else {}
    cfg = Qwen2Config(vocab_size=max(int(base.get("vocab_size", 0)), len(tok)), **SHAPE, **rope,
                      max_position_embeddings=int(base.get("max_position_embeddings", 32768)),
                      tie_word_embeddings=True, bos_token_id=base.get("bos_token_id", tok.bos_token_id),
                      eos_token_id=base.get("eos_token_id", tok.eos_token_id),
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    cfg.architectures = ["Qwen2ForCausalLM"]  # verl's HFModelConfig wants exactly one
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if (base_dir / "generation_config.json").is_file():
            shutil.copy2(base_dir / "generation_config.json", tmp / "generation_config.json")
    return {"params": sum(p.numel() for p in model.parameters()), "vocab_size": cfg.vocab_size, **SHAPE,
            "tokenizer_from": str(base_dir), "seed": seed}


if __name__ == "__main__":
    import sys

    print(json.dumps(make_tiny_model(sys.argv[1], sys.argv[2])))
