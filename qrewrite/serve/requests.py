"""The gateway's two request shapes → (tenant asked for, row), or `BadRequest` naming the field.

* `POST /v1/chat/completions`: what the teacher API takes (`qrewrite.prompts.rewrite_messages`): `model` names the
  tenant (serve.model_name, `<tenant>-rewriter`), the last user message holds the three labelled lines. The system
  message is the tenant's trained prompt whatever the client sends, and sampling settings are the release's
  (greedy, its max_new_tokens): a client's temperature or max_tokens changes nothing, as eval scored one decoding.
* `POST /v1/rewrite`: `{tenant, query, profile, history}` (tenant may be left out: the key's tenant).

Each text field is one string of at most serve.max_field_chars characters, without chat-template control tokens
(they would open a forged turn in the model's prompt).
"""

from __future__ import annotations

import json
import re

from ..prompts import has_control_tokens, parse_user_message


class BadRequest(Exception):
    """A request the gateway refuses with 400: `param` is the field (OpenAI's error shape names it too)."""

    status, code = 400, None

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


class ModelNotFound(BadRequest):
    """A `model` that names no tenant: OpenAI's 404 model_not_found."""

    status, code = 404, "model_not_found"


def parse_body(raw: bytes, max_bytes: int) -> dict:
    if len(raw) > max_bytes:
        raise BadRequest("body", f"{len(raw)} bytes, over the gateway's limit of {max_bytes} (serve.max_body_bytes)")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest("body", f"not a JSON document ({str(exc)[:120]})") from None
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    try:  # a JSON escape can decode to a lone surrogate ("\ud800"): text no tokenizer or log can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("body", "holds text that is not valid Unicode (a lone surrogate such as \\ud800)") from None
    return body


def text_field(body: dict, name: str, max_chars: int, *, required: bool = False, where: str | None = None) -> str | None:
    """One text field checked: a string (or null where optional), within the limit, no control tokens."""
    where = where or name
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(where, "is required")
        return None
    if not isinstance(value, str):
        raise BadRequest(where, f"must be a string, not {type(value).__name__}")
    return check_text(where, value, max_chars, required=required)


def check_text(where: str, value: str, max_chars: int, *, required: bool = False) -> str | None:
    if len(value) > max_chars:
        raise BadRequest(where, f"{len(value)} characters, over the limit of {max_chars} (serve.max_field_chars)")
    if has_control_tokens(value):
        raise BadRequest(where, "holds chat-template control tokens (e.g. <|im_start|>), which the gateway refuses")
    if "\x00" in value:
        raise BadRequest(where, "holds a NUL character")
    if required and not value.strip():
        raise BadRequest(where, "is empty")
    return value if value.strip() else None


def tenant_from_model(model: str, pattern: str) -> str | None:
    """The tenant a `model` names under serve.model_name ("{tenant}-rewriter"), else None."""
    head, _, tail = pattern.partition("{tenant}")
    m = re.fullmatch(re.escape(head) + r"(?P<t>[a-z0-9][a-z0-9_-]*)" + re.escape(tail), model or "")
    return m.group("t") if m else None


def rewrite_request(body: dict, max_chars: int) -> tuple[str | None, dict]:
    """/v1/rewrite → (tenant asked for or None, row)."""
    tenant = body.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise BadRequest("tenant", "must be a string")
    unknown = sorted(set(body) - {"tenant", "query", "profile", "history", "request_id"})
    if unknown:
        raise BadRequest(unknown[0], "is not a field of /v1/rewrite (tenant, query, profile, history)")
    row = {"query": text_field(body, "query", max_chars, required=True),
           "profile": text_field(body, "profile", max_chars), "history": text_field(body, "history", max_chars)}
    return tenant, row


def _content(message: dict, where: str) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones, joined
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest(where, "holds no text part")
        return "".join(texts)
    if not isinstance(content, str):
        raise BadRequest(where, "must be a string or a list of text parts")
    return content


def chat_request(body: dict, max_chars: int, model_pattern: str, language_of) -> tuple[str | None, dict]:
    """/v1/chat/completions → (tenant asked for or None, row). `language_of(tenant)`: the tenant's language (its
    prompt labels), or None for a tenant the gateway does not serve."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model", f"is required: the tenant's model name ({model_pattern})")
    tenant = tenant_from_model(model, model_pattern)
    if body.get("tenant") is not None:
        if not isinstance(body["tenant"], str) or (tenant is not None and body["tenant"] != tenant):
            raise BadRequest("tenant", f"names another tenant than model {model!r}")
        tenant = body["tenant"]
    if tenant is None:
        raise ModelNotFound("model", f"{model!r} names no tenant: use {model_pattern.replace('{tenant}', '<tenant>')}")
    if body.get("stream"):
        raise BadRequest("stream", "streaming is not offered: a rewrite is one short text")
    if body.get("n") not in (None, 1):
        raise BadRequest("n", "one rewrite per request (n: 1)")
    if body.get("tools") or body.get("functions"):
        raise BadRequest("tools" if body.get("tools") else "functions", "not offered by the rewriter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "must be a non-empty list")
    users = [(i, m) for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise BadRequest("messages", "holds no user message")
    i, message = users[-1]
    where = f"messages[{i}].content"
    text = _content(message, where)
    if len(text) > 3 * max_chars + 64:
        raise BadRequest(where, f"{len(text)} characters, over the limit (serve.max_field_chars per field)")
    language = language_of(tenant)
    if language is None:  # the caller says which tenant is unknown (400) after the key is checked
        return tenant, {}
    try:
        fields = parse_user_message(text, language)
    except ValueError as exc:
        raise BadRequest(where, f"{exc}: the user message is the three labelled lines of "
                                "qrewrite.prompts.user_message (docs/deploy.md)") from None
    row = {k: check_text(f"{where} ({k})", v, max_chars, required=k == "query") if v is not None else None
           for k, v in fields.items()}
    return tenant, row
