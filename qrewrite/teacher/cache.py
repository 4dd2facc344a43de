"""Disk cache of teacher calls: one JSON file per call key, written atomically.

The key covers provider, model, prompt and generation parameters, so a rerun (also after kill -9)
repeats no call that already succeeded. Only successes are stored: a failed call is retried next run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..io_utils import sha256_json, write_text_atomic

log = logging.getLogger(__name__)


def call_key(provider: str, model: str, messages: list[dict], params: dict) -> str:
    return sha256_json({"provider": provider, "model": model, "messages": messages, "params": params})


class DiskCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self._path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.misses += 1
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            # Atomic writes make this unreachable in normal operation; treat a damaged entry as a miss.
            log.warning("ignoring unreadable cache entry %s", path)
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def put(self, key: str, entry: dict) -> None:
        write_text_atomic(self._path(key), json.dumps(entry, ensure_ascii=False))
