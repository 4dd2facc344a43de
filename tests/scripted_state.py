"""TEST FAKE support: the state both scripted test servers (fake_openai_server.py, fault_rag_server.py) share.

A server reads its behaviour per request from STATE/script.json and appends every answered request to
STATE/requests.jsonl; it counts requests per key (for "the first n requests fail") and admitted requests in all
(for "down after n").
"""

from __future__ import annotations

import json
from pathlib import Path


class ScriptedState:
    def __init__(self, state_dir: str | Path):
        self.dir = Path(state_dir)
        self.seen: dict[str, int] = {}
        self.ok_total = 0
        self._log_fh = None

    def script(self) -> dict:
        try:
            return json.loads((self.dir / "script.json").read_text())
        except FileNotFoundError:
            return {}

    def arrive(self, key: str) -> None:
        self.seen[key] = self.seen.get(key, 0) + 1

    def fault(self, script: dict, key: str, text: str, first_key: str) -> int | str:
        """200, or the scripted fault for this request: `fail_if_contains` markers in `text`, then the first
        `n` requests per key under `script[first_key]` (every request when it has no `n`), then `down_after`."""
        fault: int | str = 200
        for marker, what in (script.get("fail_if_contains") or {}).items():
            if marker in text:
                fault = what
        first = script.get(first_key)
        if fault == 200 and first and ("n" not in first or self.seen[key] <= first["n"]):
            fault = first["status"]
        down = script.get("down_after")
        if fault == 200 and down and self.ok_total >= down["n"]:
            fault = down["status"]
        if fault == 200:
            self.ok_total += 1  # counted on admission, so concurrent requests cannot overshoot down_after.n
        return fault

    def log(self, entry: dict) -> None:
        if self._log_fh is None:
            self._log_fh = open(self.dir / "requests.jsonl", "a", buffering=1)
        self._log_fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._log_fh.flush()  # the server outlives its clients; the OS page cache is enough for the tests
