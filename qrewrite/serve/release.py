"""One tenant's release as the gateway serves it: models/T/release loaded, and how it answers one row.

The answer is the eval's release row for the same input: a rule's text (query + history, or the query), or the
model's greedy rewrite of the row alone (`qrewrite.eval.candidates.served_decoding`), finished as eval finishes it
(`finish_completion`: cleaned, a loop trimmed), then sent as the release decoding sends it
(`qrewrite.eval.route.sent_one`: the empty fallback, append_history, route_by_retrieval). What the gateway adds is
what only serving meets: a backend that fails or is too slow (the rule's text, marked), a RAG that fails while
routing (the model's own text, marked).

The release is named in every answer: `{tenant}/{released name}@{first 12 hex of lineage.json's sha256}`. The
same sha256 is in `qrewrite lineage show models/T/release` and `lineage.json` itself, so an auditor goes from a
served answer (or its access-log line) to the model's whole lineage.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import QrewriteError
from ..eval.candidates import RULE_REWRITES, served_decoding
from ..eval.route import fallback_text, needs_rag, sent_one
from ..lineage.document import LINEAGE_FILE
from ..release.folder import RELEASE_FILE, load_release
from .backends import BackendFailed, InProcessBackend, OpenAIBackend

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """The backend failed and serve.on_backend_error is 503."""


def fingerprint(folder: str | Path) -> str | None:
    """sha256 over release.json and lineage.json: what changes when the release stage writes a new release. None
    while the folder is missing or half swapped (the release stage replaces it whole; the next poll sees it)."""
    h = hashlib.sha256()
    try:
        for name in (RELEASE_FILE, LINEAGE_FILE):
            h.update((Path(folder) / name).read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def lineage_sha256(folder: str | Path) -> str:
    path = Path(folder) / LINEAGE_FILE
    if not path.is_file():
        raise QrewriteError(f"no {LINEAGE_FILE} in the release folder: an answer could not be traced to it",
                            file=str(folder), hint="rerun the release stage (snakemake models)")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gateway_rag_config(cfg: dict) -> dict:
    """The tenant RAG settings the gateway routes with: the pipeline's, with no retries and serve.rag_timeout_s
    (a request waits for its answer; a RAG that fails is routed around, said in the answer)."""
    out = copy.deepcopy(cfg)
    out["rag"]["http"] = {**out["rag"]["http"], "max_retries": 0, "timeout_s": cfg["serve"]["rag_timeout_s"]}
    return out


@dataclass
class ServedRelease:
    tenant: dict
    folder: str
    released: dict
    lineage_sha256: str
    fingerprint: str | None
    backend: object | None = None
    decoding: dict | None = None
    rag: object | None = None
    info: dict = field(default_factory=dict)

    @property
    def release_id(self) -> str:
        return f"{self.tenant['name']}/{self.released['name']}@{self.lineage_sha256[:12]}"

    def describe(self) -> dict:
        """What an answer says of the release (the structured body's `release`, the access log)."""
        return {"tenant": self.tenant["name"], "name": self.released["name"], "kind": self.released["kind"],
                "id": self.release_id, "lineage_sha256": self.lineage_sha256}

    async def answer(self, row: dict, *, timeout_s: float, on_backend_error: str) -> dict:
        """{rewrite (the text to retrieve with), model_rewrite, routed_to, fallback, completion_tokens,
        prompt_tokens} for one row (query, profile, history)."""
        if self.released["kind"] == "rule":
            text = RULE_REWRITES[self.released["rule"]]({"name": "release", "kind": "release"},
                                                        [{"query_id": None, "set": "served", **row}])[0]["rewrite"]
            return {"rewrite": text, "model_rewrite": None, "routed_to": None, "fallback": None,
                    "completion_tokens": 0, "prompt_tokens": 0}
        try:
            gen = await self.backend.generate(row, timeout_s)
        except BackendFailed as exc:
            log.warning("tenant %s: %s (%s)", self.tenant["name"], exc.reason, exc.detail)
            if on_backend_error == "503":
                raise Unavailable(f"the model backend failed ({exc.reason}): {exc.detail}") from None
            return {"rewrite": fallback_text(row), "model_rewrite": None, "routed_to": None, "fallback": exc.reason,
                    "completion_tokens": 0, "prompt_tokens": None}
        sent = await sent_one(self.decoding, self.rag, row, gen["rewrite"], on_rag_error="own")
        return {"rewrite": sent["rewrite"], "model_rewrite": gen["rewrite"], "routed_to": sent.get("routed_to"),
                "fallback": sent.get("fallback"), "completion_tokens": gen.get("new_tokens"),
                "prompt_tokens": gen.get("prompt_tokens")}

    async def aclose(self) -> None:
        for part in (self.backend, self.rag):
            if part is not None:
                await part.aclose()


def load_served(cfg: dict, tenant: dict, folder: str) -> ServedRelease:
    """Load models/T/release for serving: release.json, the lineage hash, the backend (serve.backend) for a model,
    the tenant's RAG provider where the decoding routes. A rule needs neither."""
    from ..rag.providers import make_rag

    fp = fingerprint(folder)
    doc = load_release(folder)
    released = doc["released"]
    served = ServedRelease(tenant=tenant, folder=str(folder), released=released,
                           lineage_sha256=lineage_sha256(folder), fingerprint=fp)
    if released["kind"] == "rule":
        served.info = {"backend": None}
        return served
    decoding = served_decoding(released["decoding"])
    scfg = cfg["serve"]
    if scfg["backend"] == "inprocess":
        device = decoding.get("device") or cfg["train"]["device"]
        served.backend = InProcessBackend(str(folder), tenant, decoding, device)
    else:
        base_url = scfg["openai"]["base_urls"].get(tenant["name"]) or scfg["openai"]["base_url"]
        if not base_url:
            raise QrewriteError("serve.backend is openai but serve.openai.base_url is not set",
                                hint="set it to the model server's /v1 URL (qrewrite serve-plan prints the commands)")
        served.backend = OpenAIBackend(base_url, scfg["openai"]["model"].format(tenant=tenant["name"]),
                                       scfg["openai"]["api_key_env"], tenant, decoding)
    served.decoding = decoding
    if needs_rag(decoding):
        served.rag = make_rag(gateway_rag_config(cfg), tenant)
    served.info = served.backend.describe
    return served
