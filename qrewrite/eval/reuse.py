"""A model's greedy rewrites of some rows, kept for a later stage that would generate them again.

The rl stage has the SFT model and the RL model rewrite the validation rows (training/rl/guard.py); the release
stage, next, has the same two models rewrite the same rows with the same decoding (release/score.py): the same
computation twice, about two CPU minutes a tenant in `make run`. The rl stage writes what it generated here
(`results/T/train/rl-val-rewrites.json`), and the release takes a model's rewrites from it only when that
generation is the one it would run: the same weight files (each *.safetensors by inode, size and modification
time), the same prompts in the same order (so the same batches), the same decoding values (`generation_key`),
the same device. Anything else and the release generates, as before; release.json says which it did.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..io_utils import read_json, write_json
from ..prompts import prompt_hash, rewrite_messages

FORMAT = 1


def weights_identity(model_dir: str) -> list[list]:
    """[[name, inode, size, mtime_ns]] of the model's weight files: another merge or a copy differs."""
    out = []
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        st = os.stat(f)  # through a link: the release folder hard-links the weights it hands over
        out.append([f.name, st.st_ino, st.st_size, st.st_mtime_ns])
    return out


def prompts(tenant: dict, rows: list[dict]) -> list[list[str]]:
    """[[query_id, prompt hash]] in row order: the rows, their prompts and the batches they fall into."""
    return [[r["query_id"], prompt_hash(rewrite_messages(tenant, r))] for r in rows]


def record(name: str, model_dir: str, tenant: dict, rows: list[dict], key: tuple, device: str,
           rewrites: list[str]) -> dict:
    return {"name": name, "model_dir": str(model_dir), "weights": weights_identity(model_dir), "device": device,
            "generation": list(key), "prompts": prompts(tenant, rows), "rewrites": list(rewrites)}


def write_generations(path: str, records: list[dict], note: str | None = None) -> None:
    write_json(path, {"format": FORMAT, "note": note, "generations": records})


def reusable(path: str | None, model_dir: str, tenant: dict, rows: list[dict], key: tuple,
             device: str) -> dict[str, str] | None:
    """query id → rewrite from `path`'s generation that matches this one exactly, else None."""
    if not path or not Path(path).is_file():
        return None
    doc = read_json(path)
    if doc.get("format") != FORMAT:
        return None
    want = {"weights": weights_identity(model_dir), "device": device, "generation": list(key),
            "prompts": prompts(tenant, rows)}
    if not want["weights"]:
        return None
    for g in doc["generations"]:
        if all(g.get(k) == v for k, v in want.items()):
            return {qid: text for (qid, _), text in zip(g["prompts"], g["rewrites"])}
    return None
