"""The gateway's HTTP application (FastAPI, run by uvicorn): routes, keys, errors, the access log.

Routes: `POST /v1/chat/completions` (OpenAI's shape: moving a RAG service from an API teacher to the student is a
`base_url` and `model` change), `POST /v1/rewrite` (structured), `GET /v1/models` and `GET /v1/release` (the
caller's tenant), `GET /healthz` (no key).

Every answer names the release that made it: the `X-Qrewrite-Release` header and the body's `release` (chat
completions: under `qrewrite`), with `X-Request-Id`; the access log has one JSON line per request with the same.
Errors have OpenAI's shape (`{"error": {message, type, param}}`): 401 without a valid key, 403 for a key of
another tenant, 400 naming the field (malformed, oversized, control tokens, an unknown tenant), 503 only where
serve.on_backend_error says so. An unexpected error is a 500 for that request; the gateway goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .keys import Keys, bearer
from .registry import Registry
from .release import Unavailable
from .requests import BadRequest, chat_request, parse_body, rewrite_request

log = logging.getLogger("qrewrite.serve")


class AccessLog:
    """One JSON line per request, appended and flushed as it ends (no key and no query text in it)."""

    def __init__(self, path: str | None):
        self.fh = None
        self.lock = threading.Lock()
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, sort_keys=True)
        with self.lock:
            if self.fh is not None:
                self.fh.write(line + "\n")
                self.fh.flush()
        log.info("%s %s %s %s %.0f ms", record["status"], record["endpoint"], record.get("tenant"),
                 record.get("release") or "-", record["latency_ms"])

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param


def _error(status: int, kind: str, message: str, param: str | None, request_id: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status, headers={"X-Request-Id": request_id})


def create_app(cfg: dict, registry: Registry, keys: Keys, access_log: AccessLog) -> FastAPI:
    scfg = cfg["serve"]
    languages = {n: t["language"] for n, t in registry.tenants.items()}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        watcher = asyncio.create_task(registry.watch())
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, registry.wake)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests), or no SIGHUP
            pass
        try:
            yield
        finally:
            watcher.cancel()
            await registry.aclose()
            access_log.close()

    app = FastAPI(title="qrewrite gateway", version="1", lifespan=lifespan)

    def caller(request: Request) -> str:
        tenant = keys.tenant_of(bearer(request.headers.get("authorization")))
        if tenant is None:
            raise Refused(401, "authentication_error", "a valid key is required: Authorization: Bearer <the "
                          "tenant's key>")
        return tenant

    def allowed(asked: str | None, by: str, param: str) -> str:
        asked = asked or by
        if asked not in registry.tenants:
            raise Refused(400, "invalid_request_error", f"unknown tenant {asked!r}", param)
        if asked != by:
            raise Refused(403, "permission_error", f"this key may not ask for tenant {asked!r}", param)
        return asked

    async def handle(request: Request, endpoint: str, parse) -> JSONResponse:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        rid = rid if len(rid) <= 64 and rid.isprintable() else uuid.uuid4().hex
        start = time.perf_counter()
        record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "request_id": rid, "endpoint": endpoint}
        try:
            by = caller(request)
            record["tenant"] = by
            body = parse_body(await request.body(), scfg["max_body_bytes"])
            asked, row, param = parse(body)
            tenant = allowed(asked, by, param)
            served = registry.get(tenant)  # taken once: a hot swap during the request leaves it on this release
            record.update(tenant=tenant, release=served.release_id)
            answer = await served.answer({**row, "query_id": rid}, timeout_s=scfg["timeout_s"],
                                         on_backend_error=scfg["on_backend_error"])
            record.update(status=200, routed_to=answer["routed_to"], fallback=answer["fallback"],
                          sha256=hashlib.sha256(answer["rewrite"].encode()).hexdigest()[:16])
            return JSONResponse(endpoint_body(endpoint, body, rid, served, answer),
                                headers={"X-Request-Id": rid, "X-Qrewrite-Release": served.release_id})
        except Refused as exc:
            record["status"] = exc.status
            return _error(exc.status, exc.kind, exc.message, exc.param, rid)
        except BadRequest as exc:
            record["status"] = 400
            return _error(400, "invalid_request_error", str(exc), exc.param, rid)
        except Unavailable as exc:
            record["status"] = 503
            return _error(503, "service_unavailable", str(exc), None, rid)
        except Exception as exc:  # noqa: BLE001 - one request fails, never the gateway
            log.exception("request %s failed", rid)
            record["status"] = 500
            return _error(500, "server_error", f"the gateway failed on this request ({type(exc).__name__}); "
                          f"request id {rid}", None, rid)
        finally:
            record["latency_ms"] = round((time.perf_counter() - start) * 1000, 3)
            access_log.write(record)

    def endpoint_body(endpoint: str, body: dict, rid: str, served, answer: dict) -> dict:
        release = served.describe()
        if endpoint == "rewrite":
            return {"rewrite": answer["rewrite"], "model_rewrite": answer["model_rewrite"],
                    "routed_to": answer["routed_to"], "fallback": answer["fallback"], "release": release,
                    "request_id": rid}
        usage = None
        if answer["completion_tokens"] is not None and answer["prompt_tokens"] is not None:
            usage = {"prompt_tokens": answer["prompt_tokens"], "completion_tokens": answer["completion_tokens"],
                     "total_tokens": answer["prompt_tokens"] + answer["completion_tokens"]}
        return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": answer["rewrite"]}}],
                "usage": usage,
                "qrewrite": {"model_rewrite": answer["model_rewrite"], "routed_to": answer["routed_to"],
                             "fallback": answer["fallback"], "release": release, "request_id": rid}}

    def parse_chat(body: dict):
        tenant, row = chat_request(body, scfg["max_field_chars"], scfg["model_name"], languages.get)
        return tenant, row, "model"

    def parse_rewrite(body: dict):
        tenant, row = rewrite_request(body, scfg["max_field_chars"])
        return tenant, row, "tenant"

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, "chat.completions", parse_chat)

    @app.post("/v1/rewrite")
    async def rewrite(request: Request):
        return await handle(request, "rewrite", parse_rewrite)

    def keyed(request: Request):
        """(the caller's tenant, None), or (None, the 401/403 answer)."""
        try:
            return caller(request), None
        except Refused as exc:
            return None, _error(exc.status, exc.kind, exc.message, None, uuid.uuid4().hex)

    @app.get("/v1/models")
    async def models(request: Request):
        tenant, refused = keyed(request)
        if refused:
            return refused
        name = scfg["model_name"].format(tenant=tenant)
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "qrewrite",
                                            "qrewrite_release": registry.get(tenant).describe()}]}

    @app.get("/v1/release")
    async def release(request: Request):
        tenant, refused = keyed(request)
        if refused:
            return refused
        s = registry.get(tenant)
        return {**s.describe(), "folder": s.folder, "released": s.released, "backend": s.info,
                "swaps": [w for w in registry.swaps if w["tenant"] == tenant]}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "tenants": len(registry.served)}

    return app
