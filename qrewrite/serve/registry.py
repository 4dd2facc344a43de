"""Every served tenant's release, and the hot swap: a new release is picked up without failing a request.

Each release folder is checked every serve.reload_poll_s (and at once on SIGHUP, `Registry.wake`). When its
fingerprint (release.json + lineage.json) changes, the new release is loaded in a worker thread beside the old one,
warmed up (`ServedRelease.warm_up`: its files checked against its lineage, one request answered through its
engine), then swapped in by replacing one dict entry: a request takes its tenant's release once, at its start, and
finishes on it, so requests in flight finish on the old release and later ones get the new. The old one drains
(its queue finishes) and its clients close after the longest a request may still hold it. A release that fails to
load or to warm up never answers: it is logged once (not again until the folder changes) and the old one kept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..errors import QrewriteError
from ..runtime.release import ServedRelease, fingerprint

log = logging.getLogger(__name__)


class Registry:
    def __init__(self, tenants: dict[str, dict], folders: dict[str, str], load: Callable[[str], ServedRelease],
                 *, poll_s: float, grace_s: float, warm_up_s: float = 120.0):
        self.tenants, self.folders, self._load = tenants, folders, load
        self.poll_s, self.grace_s, self.warm_up_s = poll_s, grace_s, warm_up_s
        self.served: dict[str, ServedRelease] = {}
        self.swaps: list[dict] = []
        self.refused: dict[str, dict] = {}  # tenant → the last release that failed to load: {fingerprint, error}
        self._wake: asyncio.Event | None = None

    def load_all(self) -> None:
        """Load every tenant's release (at start: a failure stops the gateway with the loader's error). Each is
        warmed up by `warm_all` before the gateway takes requests."""
        for name in self.tenants:
            self.served[name] = self._load(name)
            log.info("serving %s: %s (%s)", name, self.served[name].release_id, self.served[name].info)

    async def warm_all(self) -> None:
        """One request through every loaded release (at start: a failure stops the gateway)."""
        for name, s in self.served.items():
            try:
                await s.warm_up(self.warm_up_s)
            except Exception as exc:  # noqa: BLE001 - said whole, then the gateway stops
                raise QrewriteError(f"tenant {name}: release {s.release_id} did not answer its warm-up request "
                                    f"({type(exc).__name__}: {str(exc)[:300]})",
                                    hint="a model server behind the gateway must be up first (serve.openai); the "
                                         "release folder must be the release stage's, unedited") from None

    def get(self, tenant: str) -> ServedRelease:
        return self.served[tenant]

    def wake(self) -> None:
        """Check every release folder now (SIGHUP)."""
        if self._wake is not None:
            self._wake.set()

    async def check(self) -> list[str]:
        """Swap in every tenant's release whose folder changed; the tenants swapped."""
        swapped = []
        loop = asyncio.get_running_loop()
        for name, folder in self.folders.items():
            fp = fingerprint(folder)
            old = self.served.get(name)
            if fp is None or (old is not None and fp == old.fingerprint):
                continue
            if self.refused.get(name, {}).get("fingerprint") == fp:  # said once already: wait for a new release
                continue
            new = None
            try:
                new = await loop.run_in_executor(None, self._load, name)
                await new.warm_up(self.warm_up_s)
            except Exception as exc:  # noqa: BLE001 - a bad new release must not take the served one down
                self.refused[name] = {"fingerprint": fp, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                log.error("tenant %s: the new release in %s did not load (%s: %s); still serving %s", name, folder,
                          type(exc).__name__, str(exc)[:300], old.release_id if old else None)
                if new is not None:
                    await new.aclose()
                continue
            self.refused.pop(name, None)
            if new.fingerprint != fp:  # written again while it loaded: the next check takes the newest
                log.info("tenant %s: the release changed while it loaded; checking again", name)
            self.served[name] = new
            self.swaps.append({"tenant": name, "from": old.release_id if old else None, "to": new.release_id})
            log.info("tenant %s: now serving %s (was %s)", name, new.release_id, old.release_id if old else None)
            swapped.append(name)
            if old is not None:
                # requests holding the old release finish on it: its queue drains, then its clients close
                loop.call_later(0, lambda o=old: asyncio.ensure_future(o.aclose(self.grace_s)))
        return swapped

    async def watch(self) -> None:
        """Check the folders every poll_s, or when woken, until cancelled."""
        self._wake = asyncio.Event()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - the watcher keeps watching
                log.exception("checking the release folders failed")

    async def aclose(self, drain_s: float = 0.0) -> None:
        """Every release's queue finishes for at most `drain_s` (together), then its clients close."""
        await asyncio.gather(*(s.aclose(drain_s) for s in self.served.values()))
