"""One tenant's release as it answers: models/T/release loaded whole, and how it answers one row.

The answer is the eval's release row for the same input: a rule's text (`rules.py`), or the model's greedy
rewrite (`engine.py` batches concurrent requests; one that finds the model idle is generated alone, as the eval's
release row was), finished as eval finishes it (`finish_completion`), then sent as the release's decoding sends it
(`route.sent_one`: the empty fallback, append_history, route_by_retrieval). What serving adds is what only serving
meets: a full queue (`engine.Overloaded`, the gateway's 429), a backend that fails (the rule's text, marked, or a
503 by config), a RAG that fails while routing (the model's own text, marked).

`load_served` loads a release whole before it may answer: release.json read and its rule or model checked, the
folder's files compared with what its lineage.json recorded, the backend and RAG built, then one warm-up request
answered through them (`warm_up`). Any failure raises: the gateway keeps the release it serves.

The release is named in every answer: `{tenant}/{released name}@{first 12 hex of lineage.json's sha256}`. The
same sha256 is in `qrewrite lineage show models/T/release` and `lineage.json` itself, so an auditor goes from a
served answer (or its access-log line) to the model's whole lineage.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import QrewriteError
from ..lineage.document import LINEAGE_FILE, changed_files, model_files
from .release_file import RELEASE_FILE, load_release
from .backends import BackendFailed, InProcessBackend, OpenAIBackend
from .generate import SERVED_BATCH_SIZE
from .route import fallback_text, needs_rag, sent_one
from .rules import load_rule

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """The backend failed and serve.on_backend_error is 503."""


def served_decoding(decoding: dict) -> dict:
    """A released model's decoding as served: a request that finds its model idle is generated alone
    (SERVED_BATCH_SIZE), as the eval's release rows are."""
    return {**decoding, "batch_size": SERVED_BATCH_SIZE}


# A request every release can answer, to load one whole before it serves (its text is never scored)
WARM_UP = {"zh": {"query": "这个怎么用", "profile": None, "history": None},
           "en": {"query": "how do I use it", "profile": None, "history": None}}


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
                            file=str(folder), hint="rerun the release stage (snakemake --cores 2 models)")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_files(folder: str | Path) -> None:
    """The release folder's files (release.json and a model's weights) must be those its lineage.json recorded: a
    file edited, added or removed after the release stage wrote it raises, naming it."""
    path = Path(folder) / LINEAGE_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["model"]["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise QrewriteError(f"cannot read the recorded files of the release ({type(exc).__name__})", file=str(path),
                            hint="rerun the release stage") from None
    changed = changed_files(model_files(Path(folder)), recorded)
    if changed:
        raise QrewriteError(f"{changed[0]} is not what the release's lineage recorded "
                            f"({len(changed)} file(s) changed, added or removed since the release stage wrote it)",
                            file=str(folder), hint="rerun the release stage; never edit a release folder by hand")


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
    rule: object | None = None  # a rule release's text function (rules.load_rule)

    @property
    def release_id(self) -> str:
        return f"{self.tenant['name']}/{self.released['name']}@{self.lineage_sha256[:12]}"

    def describe(self) -> dict:
        """What an answer says of the release (the structured body's `release`, the access log): no paths, no
        URLs."""
        return {"tenant": self.tenant["name"], "name": self.released["name"], "kind": self.released["kind"],
                "id": self.release_id, "lineage_sha256": self.lineage_sha256,
                "engine": self.info.get("engine") if self.backend is not None else None}

    async def answer(self, row: dict, *, timeout_s: float, on_backend_error: str, on_rag_error: str = "own") -> dict:
        """{rewrite (the text to retrieve with), model_rewrite, routed_to, fallback, finish_reason,
        completion_tokens, prompt_tokens, generation (the model's result, None for a rule or a fallback)} for one
        row (query, profile, history). Raises `engine.Overloaded` at once past the model's capacity.
        on_backend_error: fallback (the rule's text, marked), 503 (`Unavailable`) or raise (a pipeline stage: no
        silent fallback in a figure); on_rag_error: own (the gateway) or raise (`route.sent_one`)."""
        if self.released["kind"] == "rule":
            return {"rewrite": self.rule(row), "model_rewrite": None, "routed_to": None,
                    "fallback": None, "finish_reason": "stop", "completion_tokens": 0, "prompt_tokens": 0,
                    "generation": None}
        try:
            gen = await self.backend.generate(row, timeout_s)
        except BackendFailed as exc:
            if on_backend_error == "raise":
                raise
            log.warning("tenant %s: %s (%s)", self.tenant["name"], exc.reason, exc.detail)
            if on_backend_error == "503":
                raise Unavailable(f"the model backend failed ({exc.reason}): {exc.detail}") from None
            return {"rewrite": fallback_text(row), "model_rewrite": None, "routed_to": None, "fallback": exc.reason,
                    "finish_reason": "stop", "completion_tokens": 0, "prompt_tokens": 0, "generation": None}
        sent = await sent_one(self.decoding, self.rag, row, gen["rewrite"], on_rag_error=on_rag_error)
        return {"rewrite": sent["rewrite"], "model_rewrite": gen["rewrite"], "routed_to": sent.get("routed_to"),
                "route_top1": sent.get("route_top1"), "fallback": sent.get("fallback"),
                "finish_reason": "stop" if gen.get("finished", True) else "length",
                "completion_tokens": gen.get("new_tokens"), "prompt_tokens": gen.get("prompt_tokens"),
                "generation": gen}

    async def warm_up(self, timeout_s: float) -> dict:
        """One request through the whole release (rule or backend, and the RAG where it routes): raises unless it
        answers a text of the model's own (no fallback)."""
        if hasattr(self.backend, "prepare"):
            await self.backend.prepare()
        row = {**WARM_UP.get(self.tenant.get("language"), WARM_UP["en"]), "query_id": "warm-up"}
        ans = await self.answer(row, timeout_s=timeout_s, on_backend_error="503")
        if not isinstance(ans.get("rewrite"), str) or ans.get("fallback") in ("backend_error", "backend_timeout",
                                                                               "rag_unavailable"):
            raise QrewriteError(f"the warm-up request did not get the release's answer (fallback "
                                f"{ans.get('fallback')})", file=self.folder)
        return ans

    async def aclose(self, drain_s: float = 0.0) -> None:
        if self.backend is not None:
            await self.backend.aclose(drain_s)
        if self.rag is not None:
            await self.rag.aclose()


def load_served(cfg: dict, tenant: dict, folder: str, *, check: bool = True, for_eval: bool = False) -> ServedRelease:
    """Load models/T/release: release.json and its rule or model checked, its files against its lineage (`check`),
    the lineage hash, the backend (serve.backend) for a model, the tenant's RAG provider where the decoding routes.
    The caller warms it up (`ServedRelease.warm_up`) before it serves. `for_eval`: the eval's release rows, the
    model in process whatever serve.backend says and the pipeline's RAG settings (retries, no short timeout)."""
    from ..rag.providers import make_rag

    fp = fingerprint(folder)
    doc = load_release(folder)
    released = doc["released"]
    if check:
        check_files(folder)
    served = ServedRelease(tenant=tenant, folder=str(folder), released=released,
                           lineage_sha256=lineage_sha256(folder), fingerprint=fp)
    if released["kind"] == "rule":
        served.rule = load_rule(released.get("rule"), folder)
        served.info = {"backend": None}
        return served
    decoding = served_decoding(released["decoding"])
    scfg = {**cfg["serve"], "backend": "inprocess"} if for_eval else cfg["serve"]
    if scfg["backend"] == "inprocess":
        device = decoding.get("device") or cfg["train"]["device"]
        eng = scfg["engine"]
        served.backend = InProcessBackend(str(folder), tenant, decoding, device, max_batch=eng["max_batch"],
                                          max_queued=eng["max_queued"])
    else:
        base_url = scfg["openai"]["base_urls"].get(tenant["name"]) or scfg["openai"]["base_url"]
        if not base_url:
            raise QrewriteError("serve.backend is openai but serve.openai.base_url is not set",
                                hint="set it to the model server's /v1 URL (qrewrite serve-plan prints the commands)")
        adapter = None
        if scfg["openai"]["runtime_lora"] and released.get("artifact") == "sft_merged":
            from ..paths import artifact_paths

            # the adapter the released merged model was made from, under a name that carries the release id: a
            # swap loads the new one beside the old, so an answer's release id always names the weights it came from
            adapter = {"name": f"{scfg['openai']['model'].format(tenant=tenant['name'])}@{served.lineage_sha256[:12]}",
                       "path": str(Path(artifact_paths(tenant)["sft_model"]).resolve())}
        served.backend = OpenAIBackend(base_url, scfg["openai"]["model"].format(tenant=tenant["name"]),
                                       scfg["openai"]["api_key_env"], tenant, decoding, adapter=adapter)
    served.decoding = decoding
    if needs_rag(decoding):
        served.rag = make_rag(cfg if for_eval else gateway_rag_config(cfg), tenant)
    served.info = dict(served.backend.describe)  # each backend names its engine
    return served
