"""The gateway's HTTP application (FastAPI, run by uvicorn): routes, keys, errors, the access log.

Routes: `POST /v1/chat/completions` (OpenAI's shape: a RAG service that sent the teacher's prompt moves to the
student with a `base_url` and `model` change), `POST /v1/rewrite` (structured), `GET /v1/models` and
`GET /v1/release` (the caller's tenant), `GET /healthz` (no key). No other route, no /docs or /openapi.json.

The HTTP layer only routes; each release's runtime (`qrewrite.runtime.release`) answers, its model's requests
batched by its engine. Every answer names the release that made it: the `X-Qrewrite-Release` header and the body's
`release` (chat completions: under `qrewrite`), with `X-Request-Id`; the access log has one JSON line per request
with the same, and never a key or a user's text.

Errors have OpenAI's shape (`{"error": {message, type, param, code}}`): 401 without a valid key, 403 for a key of
another tenant, 404 for a model or tenant not served (`model_not_found`) and for an unknown route, 400 naming the
field (malformed JSON, text that is not valid Unicode, oversized fields, control tokens), 413 for a body over
serve.max_body_bytes (refused from its Content-Length, before it is read), 429 with Retry-After when the tenant's
model queue is full (`rate_limit_exceeded`, answered at once), 503 only where serve.on_backend_error says so or
while the gateway shuts down. An unexpected error is a 500 for that request; the gateway goes on. A client that
disconnects while its request waits drops it from the queue (logged as 499).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import QrewriteError
from .keys import Keys, bearer
from .registry import Registry
from ..runtime.engine import Overloaded
from ..runtime.release import Unavailable
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
    def __init__(self, status: int, kind: str, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param
        self.code, self.headers = code, headers or {}


def _error(status: int, kind: str, message: str, param: str | None, request_id: str, code: str | None = None,
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers={"X-Request-Id": request_id, **(headers or {})})


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 from its Content-Length before it is read, or as soon as it passes `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Refused(400, "invalid_request_error", "Content-Length is not a number", "body")
        if int(declared) > limit:
            raise Refused(413, "invalid_request_error", f"the body is {declared} bytes, over the gateway's limit of "
                          f"{limit} (serve.max_body_bytes)", "body", "request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, "invalid_request_error", f"the body is over the gateway's limit of {limit} bytes "
                          "(serve.max_body_bytes)", "body", "request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(cfg: dict, registry: Registry, keys: Keys, access_log: AccessLog) -> FastAPI:
    scfg = cfg["serve"]
    languages = {n: t["language"] for n, t in registry.tenants.items()}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:  # a release that cannot answer stops the gateway before it takes a request
            await registry.warm_all()
        except QrewriteError as exc:
            print(f"qrewrite serve: {exc}", file=sys.stderr, flush=True)
            await registry.aclose()
            raise
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
            await registry.aclose(scfg["drain_s"])  # each model's queue finishes, for drain_s at most
            access_log.close()

    # no /docs, /redoc or /openapi.json: the gateway answers its routes and nothing else (docs/deploy.md)
    app = FastAPI(title="qrewrite gateway", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return _error(404, "invalid_request_error", f"no route {request.method} {request.url.path}: the gateway "
                          "answers POST /v1/chat/completions, POST /v1/rewrite, GET /v1/models, GET /v1/release, "
                          "GET /healthz", None, uuid.uuid4().hex, "unknown_url")
        if exc.status_code == 405:
            return _error(405, "invalid_request_error", f"{request.method} is not allowed on {request.url.path}",
                          None, uuid.uuid4().hex, "method_not_allowed")
        return _error(exc.status_code, "invalid_request_error", str(exc.detail), None, uuid.uuid4().hex)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(400, "invalid_request_error", "the request is malformed", None, uuid.uuid4().hex)

    def caller(request: Request) -> str:
        tenant = keys.tenant_of(bearer(request.headers.get("authorization")))
        if tenant is None:
            raise Refused(401, "authentication_error", "a valid key is required: Authorization: Bearer <the "
                          "tenant's key>")
        return tenant

    def allowed(asked: str | None, by: str, param: str) -> str:
        asked = asked or by
        if asked not in registry.tenants:
            what = "model" if param == "model" else "tenant"
            raise Refused(404, "invalid_request_error", f"the {what} asked for is not served here", param,
                          f"{what}_not_found")
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
            body = parse_body(await read_body(request, scfg["max_body_bytes"]), scfg["max_body_bytes"])
            asked, row, param = parse(body)
            tenant = allowed(asked, by, param)
            served = registry.get(tenant)  # taken once: a hot swap during the request leaves it on this release
            record.update(tenant=tenant, release=served.release_id)
            task = asyncio.ensure_future(served.answer({**row, "query_id": rid}, timeout_s=scfg["timeout_s"],
                                                       on_backend_error=scfg["on_backend_error"]))
            while True:  # a client that goes away drops its request from the model's queue
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    break
                if await request.is_disconnected():
                    task.cancel()
                    record["status"] = 499
                    return Response(status_code=499)
            answer = task.result()
            gen = answer.get("generation") or {}
            record.update(status=200, routed_to=answer["routed_to"], fallback=answer["fallback"],
                          sha256=hashlib.sha256(answer["rewrite"].encode()).hexdigest()[:16],
                          batch_size=gen.get("batch_size"), queue_s=gen.get("queue_s"))
            headers = {"X-Request-Id": rid, "X-Qrewrite-Release": served.release_id}
            if answer["fallback"]:
                headers["X-Qrewrite-Fallback"] = answer["fallback"]
            return JSONResponse(endpoint_body(endpoint, body, rid, served, answer), headers=headers)
        except Refused as exc:
            record["status"] = exc.status
            return _error(exc.status, exc.kind, exc.message, exc.param, rid, exc.code, exc.headers)
        except Overloaded as exc:
            record["status"] = 429
            return _error(429, "rate_limit_error", f"{exc} Retry after {exc.retry_after_s} s.", None, rid,
                          "rate_limit_exceeded", {"Retry-After": str(exc.retry_after_s)})
        except BadRequest as exc:
            record["status"] = exc.status
            return _error(exc.status, "invalid_request_error", str(exc), exc.param, rid, exc.code)
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
        prompt, completion = answer["prompt_tokens"] or 0, answer["completion_tokens"] or 0
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": answer["finish_reason"],
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
        engine = getattr(getattr(s.backend, "engine", None), "describe", None)
        # the release as the tenant may see it: names, ids, the engine's queue; no folder, URL or file path
        return {**s.describe(), "released": {k: s.released.get(k) for k in ("name", "source", "kind", "rule",
                                                                              "decoding", "sends")},
                "engine": engine() if engine else None,
                "swaps": [w for w in registry.swaps if w["tenant"] == tenant],
                "new_release_refused": tenant in registry.refused}

    @app.get("/healthz")
    async def healthz():
        """200 while every release can answer; 503 naming how many cannot (a model server that fails, an engine
        that stopped). No key: no tenant is named."""
        down = sum(1 for s in registry.served.values()
                   if s.backend is not None and not s.backend.healthy())
        body = {"status": "ok" if not down else "degraded", "tenants": len(registry.served), "unavailable": down}
        return JSONResponse(body, status_code=200 if not down else 503)

    return app
