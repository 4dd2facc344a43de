"""TEST FAKE: a scripted OpenAI-compatible chat server for fault injection and call counting.

It is a real HTTP server on loopback (the pipeline talks to it through the OpenAI SDK), but its
"model" is a stand-in: the rewrite is "改写：" + the user's question. Behaviour is read per request
from STATE/script.json, and every request is appended to STATE/requests.jsonl:

  {"latency_s": 0.0,              # sleep before answering
   "fail_if_contains": {"词": 500}, # status for prompts containing a marker (always)
   "fail_first": {"status": 429, "n": 2, "retry_after": 0}}  # first n requests per prompt fail
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
STATE: Path = Path(".")
_seen: dict[str, int] = {}


def _script() -> dict:
    try:
        return json.loads((STATE / "script.json").read_text())
    except FileNotFoundError:
        return {}


def _log(entry: dict) -> None:
    with open(STATE / "requests.jsonl", "a") as fh:
        fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@app.get("/health")
def health():
    return {"ok": True}


@app.post("/echo")
async def echo(request: Request):
    """Answers any POST with valid JSON of the wrong shape (for RAG response-shape tests)."""
    return {"received": await request.json()}


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    script = _script()
    user = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
    key = hashlib.sha256(json.dumps(body["messages"], ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]
    _seen[key] = _seen.get(key, 0) + 1
    if script.get("latency_s"):
        await asyncio.sleep(script["latency_s"])
    status = 200
    for marker, code in (script.get("fail_if_contains") or {}).items():
        if marker in user:
            status = code
    first = script.get("fail_first")
    if status == 200 and first and _seen[key] <= first["n"]:
        status = first["status"]
    _log({"key": key, "status": status, "t": time.time()})
    if status != 200:
        headers = {}
        if first and status == first["status"] and "retry_after" in first:
            headers["Retry-After"] = str(first["retry_after"])
        return JSONResponse({"error": {"message": f"scripted {status}", "type": "test"}}, status_code=status,
                            headers=headers)
    question = user.splitlines()[0].split("：", 1)[-1] if user else ""
    content = f"改写：{question}"
    prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 2
    completion_tokens = max(1, len(content) // 2)
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    STATE = Path(args.state)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
