"""TEST FAKE: a scripted OpenAI-compatible chat server for fault injection and call counting.

It is a real HTTP/1.1 server on loopback (the pipeline talks to it through the OpenAI SDK), but its
"model" is a stand-in: the rewrite is "改写：" + the user's question. It is written on raw asyncio
streams rather than a web framework so that it can misbehave at the transport level too (reset a
connection, cut a body short).

What it enforces, as the public API does (its own copy of the rules, written from the API's documented
behaviour and error bodies, not imported from qrewrite, so the pipeline's rules are checked, not echoed):
  * reasoning models (gpt-5*, not gpt-5-chat*; o1*/o3*/o4*): HTTP 400 for `max_tokens`, for a
    `temperature` other than 1, and for a `reasoning_effort` the model does not take; the error object
    is the API's: {"error": {"message", "type": "invalid_request_error", "param", "code"}};
  * OpenAI chat models (other gpt-*, chatgpt-*): HTTP 400 for `reasoning_effort`;
  * reasoning spends hidden tokens inside the cap: `usage.completion_tokens` includes them,
    `usage.completion_tokens_details.reasoning_tokens` reports them (by effort: none/minimal 0, low 48,
    medium (the default) 160, high 480, or script "reasoning_tokens"); a cap they exhaust gives
    `finish_reason: "length"` with empty content;
  * `deepseek-reasoner` answers in DeepSeek's shape: `message.reasoning_content` (the chain of thought,
    here "思考：…") beside `message.content`, reasoning tokens in usage;
  * the Batch API: POST /v1/files (multipart, purpose batch), POST /v1/batches (endpoint
    /v1/chat/completions, completion_window 24h), GET /v1/batches/{id}, GET /v1/batches (list),
    GET /v1/files/{id}/content. A job is in_progress until script "batch_delay_s" after its creation,
    then completed: each line answered like a synchronous request (same rules), failures in the error file.
Token counts are an estimate (a CJK character 1 token, other text 4 characters a token, 3 per message and
3 for the reply), or exact with --tokenizer NAME (a tiktoken-compatible encoding from the bpe_openai package,
e.g. o200k_base, GPT-5's), for measuring.

Behaviour is read per request from STATE/script.json; every request is appended to STATE/requests.jsonl once
its answer (or fault) has been written:

  {"latency_s": 0.0,                # sleep before answering (every request)
   "fail_if_contains": {"词": 500},   # fault for prompts containing a marker (always)
   "fail_first": {"status": 429, "n": 2, "retry_after": 0},  # first n requests per prompt get the fault
   "down_after": {"n": 10, "status": 503},  # after n requests let through in all, every request gets the fault
   "hang_s": 30,                    # how long the "timeout" fault keeps the client waiting
   "echo_auth": false,              # error bodies quote the request's Authorization header (as some
                                    #   services echo a bad key): tests that the pipeline redacts it
   "replies": {"词": "{\"score\": 4}"},  # assistant content for prompts containing a marker
   "default_reply": null,           # assistant content otherwise (null: the "改写：" echo)
   "reasoning_tokens": null,        # reasoning tokens a reasoning model spends (null: by reasoning_effort)
   "batch_delay_s": 0,              # a batch job completes this long after its creation
   "batch_create_delay_s": 0,       # POST /v1/batches creates the job, then answers this much later
   "batch_fail_if_contains": {"词": 500}}  # batch rows whose prompt contains a marker fail with that status

A fault (the values of fail_if_contains, fail_first.status) is an HTTP status (int: 429 carries
Retry-After when fail_first.retry_after is set), or one of:
  "timeout"         accept the request, answer nothing for hang_s seconds (the client's timeout fires)
  "reset"           close the connection with a TCP RST before answering
  "malformed_json"  200, application/json, a body that is not valid JSON
  "empty_choices"   200, a well-formed completion with "choices": []
  "truncated"       200, Content-Length promises the whole body but half is sent, then the connection
                    closes; for a streaming request, two SSE chunks and then the cut (no [DONE])

Log entries: {"endpoint": "chat", "key": prompt hash, "status": 200 | HTTP status | fault name, "t": time,
"stream": bool, "model": requested model, "params": the request's keys but model and messages, "usage": the
usage answered, "auth_sha256": sha256 of the Authorization header (the key itself is never logged)}; the Batch
API's calls as {"endpoint": "files.create" | "batches.create" | "batches.retrieve" | "batches.list" |
"files.content", "t", "status", ...}, and each batch row it answers as {"endpoint": "batch_row", "key", ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import email.parser
import email.policy
import hashlib
import itertools
import json
import os
import re
import socket
import struct
import time

from scripted_state import ScriptedState

STATE: ScriptedState = ScriptedState(".")
TOKENIZER = None  # --tokenizer: a tiktoken-compatible encoding; None: the estimate
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


# --- what the public API enforces (the fake's own copy) -------------------------------------------------------
REASONING = re.compile(r"(gpt-5(?!-chat)|o[134])([-.]|$)")
OPENAI_CHAT = re.compile(r"(gpt-|chatgpt-)")
EFFORTS = [(r"gpt-5-pro", ["high"]), (r"gpt-5\.\d", ["none", "low", "medium", "high"]),
           (r"gpt-5", ["minimal", "low", "medium", "high"]), (r"o1-(mini|preview)", []), (r"o\d", ["low", "medium", "high"])]
REASONING_SPENT = {"none": 0, "minimal": 0, "low": 48, "medium": 160, "high": 480}


def api_error(message: str, param: str | None, code: str | None, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _listing(values: list[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def refusal(body: dict) -> dict | None:
    """The HTTP 400 error body the public API answers to this request, or None."""
    model = str(body.get("model", ""))
    if REASONING.match(model):
        if "max_tokens" in body:
            return api_error("Unsupported parameter: 'max_tokens' is not supported with this model. "
                             "Use 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
        if "temperature" in body and body["temperature"] != 1:
            return api_error(f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                             "model. Only the default (1) value is supported.", "temperature", "unsupported_value")
        if body.get("reasoning_effort") is not None:
            allowed = next(a for p, a in EFFORTS if re.match(p, model))
            if not allowed:
                return api_error("Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                                 "reasoning_effort", "unsupported_parameter")
            if body["reasoning_effort"] not in allowed:
                return api_error(f"Unsupported value: 'reasoning_effort' does not support "
                                 f"'{body['reasoning_effort']}' with this model. Supported values are: "
                                 f"{_listing(allowed)}.", "reasoning_effort", "unsupported_value")
    elif OPENAI_CHAT.match(model) and "reasoning_effort" in body:
        return api_error("Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                         "reasoning_effort", "unsupported_parameter")
    return None


def count_tokens(text: str) -> int:
    if TOKENIZER is not None:
        return len(TOKENIZER.encode(text))
    cjk = len(re.findall(r"[\u3000-\u9fff\uff00-\uffef]", text))
    return cjk + (len(text) - cjk + 3) // 4


def _completion(body: dict, content: str, script: dict | None = None) -> dict:
    """A completion of `content`: reasoning models spend reasoning tokens first, all within the cap."""
    script = script or {}
    model = str(body["model"])
    prompt_tokens = 3 + sum(3 + count_tokens(m["content"]) for m in body["messages"])
    reasoning = 0
    message = {"role": "assistant", "content": content}
    if REASONING.match(model) or model.startswith("deepseek-reasoner"):
        effort = body.get("reasoning_effort") or "medium"
        reasoning = script.get("reasoning_tokens")
        reasoning = REASONING_SPENT[effort] if reasoning is None else int(reasoning)
        if model.startswith("deepseek-reasoner"):
            message["reasoning_content"] = "思考：" + "嗯" * max(0, reasoning - 2)
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    visible, finish = count_tokens(content), "stop"
    if cap is not None and reasoning + visible > cap:
        finish, reasoning = "length", min(reasoning, cap)
        keep = cap - reasoning  # what is left of the cap for the reply, cut to fit
        while content and count_tokens(content) > keep:
            content = content[:-1]
        message["content"], visible = content, count_tokens(content)
    completion_tokens = visible + reasoning
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens_details": {"reasoning_tokens": reasoning}}}


def _user(body: dict) -> str:
    return next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")


def _content(script: dict, user: str) -> str:
    replies = script.get("replies") or {}
    content = next((c for m, c in replies.items() if m in user), script.get("default_reply"))
    if content is None:
        question = user.splitlines()[0].split("：", 1)[-1] if user else ""
        content = f"改写：{question}"
    return content


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


async def _chat(body: dict, key: str, headers: dict, writer: asyncio.StreamWriter, record: dict) -> tuple[str | int, bool]:
    """Answer one chat completion; return (what to log as its status, whether the connection stays open).
    The usage answered goes into `record` (logged)."""
    script = STATE.script()
    user = _user(body)
    STATE.arrive(key)
    stream = bool(body.get("stream"))
    if script.get("latency_s"):
        await asyncio.sleep(script["latency_s"])
    refused = refusal(body)
    if refused is not None:
        writer.write(_response(400, _json(refused)))
        await writer.drain()
        return 400, True
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
        writer.write(_response(fault, _json(api_error(message, None, None, type_="test")), extra=extra))
        await writer.drain()
        return fault, True
    if fault == "malformed_json":
        writer.write(_response(200, b'{"id": "chatcmpl-test", "object": "chat.completion", "choices": [{"ind'))
        await writer.drain()
        return "malformed_json", True

    content = _content(script, user)
    completion = _completion(body, content, script)
    record["usage"] = completion["usage"]
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


# --- vLLM's runtime LoRA loading (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) -------------------------
LORAS: dict[str, str] = {}  # adapter name → the folder it was loaded from


def _lora(path: str, body: dict) -> tuple[int, str]:
    """What vLLM enforces: a name loaded once, from a folder holding adapter_config.json; unloading a name it holds."""
    name = body.get("lora_name")
    if path.endswith("/load_lora_adapter"):
        if not name or not body.get("lora_path"):
            return 400, "Both 'lora_name' and 'lora_path' must be provided."
        if name in LORAS:
            return 400, f"The lora adapter '{name}' has already been loaded."
        if not os.path.isfile(os.path.join(body["lora_path"], "adapter_config.json")):
            return 404, f"Loading lora {name} failed: No adapter found for {body['lora_path']}"
        LORAS[name] = body["lora_path"]
        return 200, f"Success: LoRA adapter '{name}' added successfully."
    if name not in LORAS:
        return 404, f"The lora adapter '{name}' cannot be found."
    del LORAS[name]
    return 200, f"Success: LoRA adapter '{name}' removed successfully."


# --- the Batch API ------------------------------------------------------------------------------------------
FILES: dict[str, dict] = {}    # file id → {"purpose", "filename", "data": bytes, "created_at"}
BATCHES: dict[str, dict] = {}  # batch id → the batch object
_IDS = itertools.count(1)


def _file_object(fid: str) -> dict:
    f = FILES[fid]
    return {"id": fid, "object": "file", "bytes": len(f["data"]), "created_at": f["created_at"],
            "filename": f["filename"], "purpose": f["purpose"], "status": "processed"}


def _new_file(data: bytes, filename: str, purpose: str) -> str:
    fid = f"file-test{next(_IDS)}"
    FILES[fid] = {"purpose": purpose, "filename": filename, "data": data, "created_at": int(time.time())}
    return fid


def _multipart(headers: dict, raw: bytes) -> dict:
    """The fields of a multipart/form-data body: name → (filename or None, bytes)."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + headers.get("content-type", "").encode("latin-1") + b"\r\n\r\n" + raw)
    return {part.get_param("name", header="content-disposition"): (part.get_filename(), part.get_payload(decode=True))
            for part in msg.iter_parts()}


def _batch_line(line: dict, script: dict) -> tuple[bool, dict]:
    """(answered, output line) for one input line, answered as the synchronous endpoint would."""
    body = line.get("body") or {}
    rid = f"batch_req_test{next(_IDS)}"

    def out(status: int, payload: dict) -> dict:
        return {"id": rid, "custom_id": line.get("custom_id"),
                "response": {"status_code": status, "request_id": rid, "body": payload}, "error": None}

    if line.get("url") != "/v1/chat/completions" or line.get("method") != "POST":
        return False, out(400, api_error(f"Invalid URL: {line.get('url')}", "url", "invalid_url"))
    refused = refusal(body)
    if refused is not None:
        return False, out(400, refused)
    user = _user(body)
    for marker, status in (script.get("batch_fail_if_contains") or {}).items():
        if marker in user:
            return False, out(int(status), api_error(f"scripted {status}", None, None, type_="test"))
    return True, out(200, _completion(body, _content(script, user), script))


def _finish_batch(b: dict, script: dict) -> None:
    """Answer every line of the job's input file; output and error files as the API writes them."""
    lines = [json.loads(l) for l in FILES[b["input_file_id"]]["data"].decode("utf-8").splitlines() if l.strip()]
    ok, failed = [], []
    for line in lines:
        answered, row = _batch_line(line, script)
        (ok if answered else failed).append(row)
        STATE.log({"endpoint": "batch_row", "batch_id": b["id"], "key": prompt_key(line.get("body") or {"messages": []}),
                   "status": row["response"]["status_code"], "t": time.time(), "model": (line.get("body") or {}).get("model"),
                   "usage": row["response"]["body"].get("usage")})

    def jsonl(rows):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")

    now = int(time.time())
    b.update(status="completed", finalizing_at=now, completed_at=now,
             output_file_id=_new_file(jsonl(ok), "batch_output.jsonl", "batch_output") if ok else None,
             error_file_id=_new_file(jsonl(failed), "batch_errors.jsonl", "batch_output") if failed else None,
             request_counts={"total": len(lines), "completed": len(ok), "failed": len(failed)})


def _batches(method: str, path: str, headers: dict, raw: bytes) -> tuple[int, bytes, str, dict]:
    """(status, body, content type, log entry) of a Files / Batches API request."""
    script = STATE.script()
    parts = path.strip("/").split("/")  # v1, files|batches, [id], [content]
    if method == "POST" and parts == ["v1", "files"]:
        fields = _multipart(headers, raw)
        purpose = (fields.get("purpose") or (None, b""))[1].decode()
        filename, data = fields.get("file") or (None, None)
        if data is None or purpose not in ("batch", "assistants", "fine-tune", "vision", "user_data", "evals"):
            return 400, _json(api_error("'file' and a valid 'purpose' are required", "purpose", None)), \
                "application/json", {"endpoint": "files.create"}
        fid = _new_file(data, filename or "upload", purpose)
        return 200, _json(_file_object(fid)), "application/json", {"endpoint": "files.create", "file_id": fid}
    if method == "GET" and len(parts) == 4 and parts[1] == "files" and parts[3] == "content":
        if parts[2] not in FILES:
            return 404, _json(api_error(f"No such File object: {parts[2]}", "id", None)), "application/json", \
                {"endpoint": "files.content"}
        return 200, FILES[parts[2]]["data"], "application/octet-stream", {"endpoint": "files.content",
                                                                        "file_id": parts[2]}
    if method == "POST" and parts == ["v1", "batches"]:
        req = json.loads(raw or b"{}")
        entry = {"endpoint": "batches.create"}
        if req.get("endpoint") != "/v1/chat/completions":
            return 400, _json(api_error("Invalid endpoint", "endpoint", None)), "application/json", entry
        if req.get("completion_window") != "24h":
            return 400, _json(api_error("Invalid completion_window: only '24h' is supported", "completion_window",
                                        None)), "application/json", entry
        f = FILES.get(req.get("input_file_id"))
        if f is None or f["purpose"] != "batch":
            return 400, _json(api_error("Invalid input_file_id: no file with purpose batch", "input_file_id",
                                        None)), "application/json", entry
        bid = f"batch_test{next(_IDS)}"
        now = int(time.time())
        BATCHES[bid] = {"id": bid, "object": "batch", "endpoint": req["endpoint"], "errors": None,
                        "input_file_id": req["input_file_id"], "completion_window": "24h", "status": "in_progress",
                        "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": now,
                        "expires_at": now + 86400, "finalizing_at": None, "completed_at": None, "failed_at": None,
                        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                        "request_counts": {"total": 0, "completed": 0, "failed": 0},
                        "metadata": req.get("metadata"), "_t": time.time()}
        return 200, _json(_public(BATCHES[bid])), "application/json", {**entry, "batch_id": bid}
    if method == "GET" and parts == ["v1", "batches"]:
        data = [_public(b) for b in sorted(BATCHES.values(), key=lambda b: -b["_t"])]
        return 200, _json({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                           "last_id": data[-1]["id"] if data else None, "has_more": False}), "application/json", \
            {"endpoint": "batches.list"}
    if method == "GET" and len(parts) == 3 and parts[1] == "batches":
        b = BATCHES.get(parts[2])
        if b is None:
            return 404, _json(api_error(f"No batch found with id '{parts[2]}'", "id", None)), "application/json", \
                {"endpoint": "batches.retrieve"}
        if b["status"] == "in_progress" and time.time() - b["_t"] >= float(script.get("batch_delay_s", 0)):
            _finish_batch(b, script)
        return 200, _json(_public(b)), "application/json", {"endpoint": "batches.retrieve", "batch_id": b["id"],
                                                           "batch_status": b["status"]}
    return 404, _json(api_error(f"no route {method} {path}", None, None)), "application/json", {"endpoint": path}


def _public(b: dict) -> dict:
    return {k: v for k, v in b.items() if not k.startswith("_")}


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
            elif method == "POST" and path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                status, text = _lora(path, json.loads(raw or b"{}"))
                STATE.log({"endpoint": path.rsplit("/", 1)[1], "status": status, "t": time.time(),
                           "body": json.loads(raw or b"{}")})
                writer.write(_response(status, text.encode(), content_type="text/plain"))
            elif method == "POST" and path == "/v1/chat/completions" and "@" in json.loads(raw).get("model", "") \
                    and json.loads(raw)["model"] not in LORAS:
                # vLLM answers a model name it does not serve with 404 (an adapter never loaded, or unloaded)
                model = json.loads(raw)["model"]
                STATE.log({"endpoint": "chat", "status": 404, "t": time.time(), "model": model})
                writer.write(_response(404, _json(api_error(f"The model `{model}` does not exist.", None,
                                                            "model_not_found", "NotFoundError"))))
            elif method == "POST" and path == "/v1/chat/completions":
                body = json.loads(raw)
                key = prompt_key(body)
                record: dict = {}
                status, still_open = await _chat(body, key, headers, writer, record)
                auth = headers.get("authorization", "")
                STATE.log({"endpoint": "chat", "key": key, "status": status, "t": time.time(),
                           "stream": bool(body.get("stream")), "model": body.get("model"),
                           "params": {k: v for k, v in body.items() if k not in ("model", "messages")},
                           "usage": record.get("usage"), "auth_sha256": hashlib.sha256(auth.encode()).hexdigest()})
                if not still_open:
                    return
            elif path.startswith(("/v1/files", "/v1/batches")):
                status, data, ctype, entry = _batches(method, path, headers, raw)
                STATE.log({**entry, "status": status, "t": time.time()})  # done: logged before it is answered
                delay = STATE.script().get("batch_create_delay_s") if entry["endpoint"] == "batches.create" else 0
                if delay:  # the job exists, its id reaches the client only later (a client killed meanwhile)
                    await asyncio.sleep(float(delay))
                writer.write(_response(status, data, content_type=ctype))
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
    parser.add_argument("--tokenizer", help="count tokens with this bpe_openai encoding (e.g. o200k_base)")
    args = parser.parse_args()
    STATE = ScriptedState(args.state)
    if args.tokenizer:
        import bpe_openai

        TOKENIZER = bpe_openai.get_encoding(args.tokenizer)
    asyncio.run(_main(args.port))
