"""TEST FAKE: the real `qrewrite serve-rag` app behind a fault-injecting wrapper, on loopback.

Retrieval is the production app (`qrewrite.rag.server.create_app`, BM25 over the project's KBs);
only this wrapper, which lives in tests/ so fault injection never reaches production code, can be
told to fail or to slow down. Behaviour is read per request from STATE/script.json:

  {"latency_s": 0.0,                        # sleep before answering (every request)
   "fail": {"status": 503, "n": 2,          # the first n requests per (query, rewrite) get `status`;
            "retry_after": 0},              #   no "n": every request; Retry-After header if given
   "fail_if_contains": {"词": 500},          # status for requests whose query or rewrite has a marker
   "down_after": {"n": 10, "status": 503},   # after n requests let through in all, every request fails
   "reply": {...},                          # answer every request 200 with this JSON instead (wrong shapes)
   "raw_reply": "<html>...</html>"}         # answer every request 200 with this text/html body

Every answered request is appended to STATE/requests.jsonl:
{"key": hash of (tenant_id, query, rewritten_query), "status": int, "t": time}.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time

from scripted_state import ScriptedState

STATE: ScriptedState = ScriptedState(".")


def request_key(payload: dict) -> str:
    ident = [payload.get("tenant_id"), payload.get("query"), payload.get("rewritten_query") or ""]
    return hashlib.sha256(json.dumps(ident, ensure_ascii=False).encode()).hexdigest()[:16]


class FaultInjector:
    """ASGI middleware: script-driven latency and failures in front of the wrapped app."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = {}
        key = request_key(payload if isinstance(payload, dict) else {})
        STATE.arrive(key)
        script = STATE.script()
        if script.get("latency_s"):
            await asyncio.sleep(script["latency_s"])
        text = f"{payload.get('query', '')} {payload.get('rewritten_query') or ''}" if isinstance(payload, dict) else ""
        status = STATE.fault(script, key, text, "fail")
        headers = []
        fail = script.get("fail")
        if fail and status == fail["status"] and "retry_after" in fail:
            headers.append((b"retry-after", str(fail["retry_after"]).encode()))
        ctype = b"application/json"
        if status != 200:
            body = json.dumps({"code": status, "message": f"scripted {status}"}).encode()
        elif "reply" in script:
            body = json.dumps(script["reply"], ensure_ascii=False, allow_nan=True).encode()
        elif "raw_reply" in script:
            body, ctype = script["raw_reply"].encode(), b"text/html"
        else:
            body = None
        if body is not None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                                    *headers]})
            await send({"type": "http.response.body", "body": body})
            STATE.log({"key": key, "status": status, "t": time.time()})
            return

        sent = {"status": None}

        async def replay():
            return {"type": "http.request", "body": raw, "more_body": False}

        async def capture(message):
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            await send(message)

        await self.app(scope, replay, capture)
        STATE.log({"key": key, "status": sent["status"], "t": time.time()})


def main() -> None:
    global STATE
    import uvicorn

    from qrewrite.config import load_config
    from qrewrite.rag.server import create_app

    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    STATE = ScriptedState(args.state)
    uvicorn.run(FaultInjector(create_app(load_config(args.config))), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
