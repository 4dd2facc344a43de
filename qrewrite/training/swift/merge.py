"""Merge a LoRA adapter into its base model (`swift export --merge_lora true`) into a full HF folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from ...config import base_model_swift
from ...errors import QrewriteError
from ...io_utils import atomic_dir
from . import commands, runner


def merge_lora(cfg: dict, *, base: str, adapter: str, out: str, log_file: str | None = None,
               threads: int | None = None) -> dict:
    hp = {"device": cfg["train"]["device"], **base_model_swift(cfg)}
    with atomic_dir(out) as tmp:
        export_dir = Path(tmp) / "export"  # swift wants to create output_dir itself
        argv = commands.export_merge_cmd({**hp, "model": base, "adapter": adapter, "output_dir": str(export_dir)})
        wall = runner.run_swift(argv, log_file=log_file, env={"OMP_NUM_THREADS": str(threads)} if threads else None)
        if not (export_dir / "config.json").is_file() or not list(export_dir.glob("*.safetensors")):
            raise QrewriteError(f"swift export wrote no model into {export_dir}")
        for p in export_dir.iterdir():
            shutil.move(str(p), Path(tmp) / p.name)
        export_dir.rmdir()
    return {"wall_s": round(wall, 1)}
