"""The chat prompt shared by the teacher, the SFT data and the student at inference time."""

from __future__ import annotations

import re

from .io_utils import sha256_json

# A field is one line of the prompt: a newline in a profile or history could forge a "用户问题：" line.
_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x85\u2028\u2029]+\s*")
# Chat-template control tokens (<|im_start|>, <|endoftext|>, DeepSeek's <｜…｜>, Qwen3's <think>) typed into a
# query would be encoded as real special tokens by the tokenizer and open a forged turn: they are dropped.
_CONTROL_TOKENS = re.compile(r"<\|[^<>|]{0,40}\|>|<｜[^<>｜]{0,40}｜>|</?(?:think|tool_call|tool_response)>")

_LABELS = {
    "zh": ("用户问题", "用户画像", "历史摘要", "无"),
    "en": ("Question", "User profile", "History summary", "none"),
}


def prompt_field(text: str) -> str:
    """A user-supplied value as it goes into the prompt: one line, no chat-template control tokens."""
    return _LINE_BREAKS.sub(" ", _CONTROL_TOKENS.sub("", text or "")).strip()


def has_control_tokens(text: str) -> bool:
    return bool(_CONTROL_TOKENS.search(text or ""))


def user_message(query: str, profile: str, history: str, language: str = "zh") -> str:
    query_label, profile_label, history_label, none = _LABELS[language]
    query, profile, history = prompt_field(query), prompt_field(profile), prompt_field(history)
    sep = "：" if language == "zh" else ": "
    return (f"{query_label}{sep}{query}\n{profile_label}{sep}{profile or none}\n"
            f"{history_label}{sep}{history or none}")


def rewrite_messages(tenant: dict, row: dict) -> list[dict]:
    return [
        {"role": "system", "content": tenant["system_prompt"]},
        {"role": "user", "content": user_message(row["query"], row["profile"], row["history"], tenant["language"])},
    ]


def prompt_hash(messages: list[dict]) -> str:
    return sha256_json(messages)[:16]


def parse_user_message(text: str, language: str = "zh") -> dict:
    """{query, profile, history} back from a `user_message` (the teacher's, SFT's and the gateway's request): three
    lines, each its label and separator first. A field that reads as the language's "none" is None. Raises
    ValueError saying which line does not match."""
    labels = _LABELS[language]
    sep = "：" if language == "zh" else ": "
    lines = (text or "").split("\n")
    if len(lines) != 3:
        raise ValueError(f"expected 3 lines ({', '.join(labels[:3])}), found {len(lines)}")
    out = {}
    for key, label, line in zip(("query", "profile", "history"), labels[:3], lines):
        # a client that typed the ASCII colon in a Chinese prompt is read too
        for s in dict.fromkeys((sep, ":", ": ")):
            if line.startswith(label + s):
                value = line[len(label + s):].strip()
                break
        else:
            raise ValueError(f"line {len(out) + 1} must start with {label + sep!r}")
        out[key] = None if key != "query" and value == labels[3] else value
    return out
