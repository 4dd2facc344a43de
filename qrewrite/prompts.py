"""The chat prompt shared by the teacher, the SFT data and the student at inference time."""

from __future__ import annotations

from .io_utils import sha256_json

_LABELS = {
    "zh": ("用户问题", "用户画像", "历史摘要", "无"),
    "en": ("Question", "User profile", "History summary", "none"),
}


def user_message(query: str, profile: str, history: str, language: str = "zh") -> str:
    q, p, h, none = _LABELS[language]
    return f"{q}：{query}\n{p}：{profile or none}\n{h}：{history or none}" if language == "zh" else \
        f"{q}: {query}\n{p}: {profile or none}\n{h}: {history or none}"


def rewrite_messages(tenant: dict, row: dict) -> list[dict]:
    return [
        {"role": "system", "content": tenant["system_prompt"]},
        {"role": "user", "content": user_message(row["query"], row["profile"], row["history"], tenant["language"])},
    ]


def prompt_hash(messages: list[dict]) -> str:
    return sha256_json(messages)[:16]
