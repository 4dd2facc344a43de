"""Disk cache of teacher calls: one JSON file per call key, written atomically.

The key covers provider, model, prompt and generation parameters, so a rerun (also after kill -9)
repeats no call that already succeeded. Only successes are stored: a failed call is retried next run.

Entries are written to a temp file and renamed into place, but not fsynced: a killed process cannot
leave a torn entry (its writes are already in the kernel), and after an OS crash an entry cut short
reads as a miss (one repeated call, never a wrong answer). The fsync would cost milliseconds per
call on the event loop, i.e. most of the stage's own overhead against a 200 ms API.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from .io_utils import sha256_json

_UMASK = os.umask(0)
os.umask(_UMASK)  # reading the umask means setting it: put it back

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
            # Unreachable after a kill (entries are renamed into place whole); after an OS crash an entry
            # may be cut short. Either way a damaged entry is a miss: the call is made again.
            log.warning("ignoring unreadable cache entry %s", path)
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def has(self, key: str) -> bool:
        """Whether an entry is there (counted neither as a hit nor a miss)."""
        return self._path(key).exists()

    def put(self, key: str, entry: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; entries get the usual mode
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, ensure_ascii=False))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
