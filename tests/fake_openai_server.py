"""TEST FAKE: a scripted OpenAI-compatible chat server for fault injection and call counting.

It is a real HTTP/1.1 server on loopback (the pipeline talks to it through the OpenAI SDK), but its
"model" is a stand-in: the rewrite is "改写：" + the user's question. It is written on raw asyncio
streams rather than a web framework so that it can misbehave at the transport level too (reset a
connection, cut a body short). Behaviour is read per request from STATE/script.json; every request
is appended to STATE/requests.jsonl once its answer (or fault) has been written:

  {"latency_s": 0.0,                # sleep before answering (every request)
   "fail_if_contains": {"词": 500},   # fault for prompts containing a marker (always)
   "fail_first": {"status": 429, "n": 2, "retry_after": 0},  # first n requests per prompt get the fault
   "down_after": {"n": 10, "status": 503},  # after n requests let through in all, every request gets the fault
   "hang_s": 30,                    # how long the "timeout" fault keeps the client waiting
   "echo_auth": false,              # error bodies quote the request's Authorization header (as some
                                    #   services echo a bad key): tests that the pipeline redacts it
   "replies": {"词": "{\"score\": 4}"},  # assistant content for prompts containing a marker
   "default_reply": null}           # assistant content otherwise (null: the "改写：" echo)

A fault (the values of fail_if_contains, fail_first.status) is an HTTP status (int: 429 carries
Retry-After when fail_first.retry_after is set), or one of:
  "timeout"         accept the request, answer nothing for hang_s seconds (the client's timeout fires)
  "reset"           close the connection with a TCP RST before answering
  "malformed_json"  200, application/json, a body that is not valid JSON
  "empty_choices"   200, a well-formed completion with "choices": []
  "truncated"       200, Content-Length promises the whole body but half is sent, then the connection
                    closes; for a streaming request, two SSE chunks and then the cut (no [DONE])

Log entries: {"key": prompt hash, "status": 200 | HTTP status | fault name, "t": time, "stream": bool,
"model": requested model, "auth_sha256": sha256 of the Authorization header (the key itself is never logged)}.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import struct
import time

from scripted_state import ScriptedState

STATE: ScriptedState = ScriptedState(".")
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           408: "Request Timeout", 429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable", 504: "Gateway Timeout"}
FAULTS = ("timeout", "reset", "malformed_json", "empty_choices", "truncated")


def _head(status: int, headers: dict) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response(status: int, body: bytes, content_type: str = "application/json", extra: dict | None = None) -> bytes:
    return _head(status, {"Content-Type": content_type, "Content-Length": len(body), **(extra or {})}) + body


def _json(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort with SO_LINGER 0: the kernel sends RST instead of FIN (a "connection reset by peer")."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _completion(body: dict, content: str) -> dict:
    prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 2
    completion_tokens = max(1, len(content) // 2)
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def _sse_events(body: dict, content: str) -> list[bytes]:
    def chunk(delta: dict, finish=None) -> bytes:
        obj = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
               "model": body["model"], "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + _json(obj) + b"\n\n"

    pieces = [content[i:i + 4] for i in range(0, len(content), 4)] or [""]
    return ([chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in pieces]
            + [chunk({}, "stop"), b"data: [DONE]\n\n"])


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def prompt_key(body: dict) -> str:
    return hashlib.sha256(json.dumps(body["messages"], ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]


async def _chat(body: dict, key: str, headers: dict, writer: asyncio.StreamWriter) -> tuple[str | int, bool]:
    """Answer one chat completion; return (what to log as its status, whether the connection stays open)."""
    script = STATE.script()
    user = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
    STATE.arrive(key)
    stream = bool(body.get("stream"))
    if script.get("latency_s"):
        await asyncio.sleep(script["latency_s"])
    fault = STATE.fault(script, key, user, "fail_first")
    first = script.get("fail_first")

    if fault == "reset":
        _reset(writer)
        return "reset", False
    if fault == "timeout":
        await asyncio.sleep(float(script.get("hang_s", 30)))
        writer.close()
        return "timeout", False
    if isinstance(fault, int) and fault != 200:
        extra = {}
        if first and fault == first["status"] and "retry_after" in first:
            extra["Retry-After"] = str(first["retry_after"])
        message = f"scripted {fault}"
        if script.get("echo_auth"):
            message += f" (request had Authorization: {headers.get('authorization')})"
        writer.write(_response(fault, _json({"error": {"message": message, "type": "test"}}), extra=extra))
        await writer.drain()
        return fault, True
    if fault == "malformed_json":
        writer.write(_response(200, b'{"id": "chatcmpl-test", "object": "chat.completion", "choices": [{"ind'))
        await writer.drain()
        return "malformed_json", True

    replies = script.get("replies") or {}
    content = next((c for m, c in replies.items() if m in user), script.get("default_reply"))
    if content is None:
        question = user.splitlines()[0].split("：", 1)[-1] if user else ""
        content = f"改写：{question}"
    completion = _completion(body, content)
    if fault == "empty_choices":
        completion["choices"] = []
    elif fault not in (200, "truncated"):
        raise ValueError(f"unknown fault {fault!r} in script.json (known: HTTP status ints, {FAULTS})")

    if stream:
        events = _sse_events(body, content)
        writer.write(_head(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"}))
        if fault == "truncated":  # two events, then half of the third, then the connection goes away
            writer.write(b"".join(_chunked(e) for e in events[:2]) + _chunked(events[2])[:10])
            await writer.drain()
            writer.close()
            return "truncated", False
        writer.write(b"".join(_chunked(e) for e in events) + b"0\r\n\r\n")
        await writer.drain()
        return fault, True
    data = _json(completion)
    if fault == "truncated":
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": len(data)})
                     + data[: len(data) // 2])
        await writer.drain()
        writer.close()
        return "truncated", False
    writer.write(_response(200, data))
    await writer.drain()
    return fault, True


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
    return method, path.split("?", 1)[0], headers, body


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            req = await _read_request(reader)
            if req is None:
                break
            method, path, headers, raw = req
            keep = headers.get("connection", "").lower() != "close"
            if method == "GET" and path == "/health":
                writer.write(_response(200, b'{"ok": true}'))
            elif method == "POST" and path == "/echo":
                # Valid JSON of the wrong shape (for RAG response-shape tests).
                writer.write(_response(200, _json({"received": json.loads(raw or b"null")})))
            elif method == "POST" and path == "/v1/chat/completions":
                body = json.loads(raw)
                key = prompt_key(body)
                status, still_open = await _chat(body, key, headers, writer)
                auth = headers.get("authorization", "")
                STATE.log({"key": key, "status": status, "t": time.time(), "stream": bool(body.get("stream")),
                      "model": body.get("model"), "auth_sha256": hashlib.sha256(auth.encode()).hexdigest()})
                if not still_open:
                    return
            else:
                writer.write(_response(404, _json({"error": {"message": f"no route {method} {path}"}})))
            await writer.drain()
            if not keep:
                break
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away (killed, or timed out on a "timeout" fault)
    finally:
        if not writer.is_closing():
            writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    STATE = ScriptedState(args.state)
    asyncio.run(_main(args.port))
