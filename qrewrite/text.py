"""Tokenisation shared by the local retriever and the prf teacher (jieba for Chinese)."""

from __future__ import annotations

import logging
import re
import unicodedata

import jieba

jieba.setLogLevel(logging.WARNING)

# Function words and question particles that carry no retrieval signal.
ZH_STOPWORDS = frozenset(
    "的 了 吗 呢 吧 啊 呀 嘛 哦 么 是 我 你 他 她 它 们 这 那 这个 那个 就 都 也 还 和 与 或 在 有 要 想 "
    "请问 一下 一个 什么 怎么 怎么样 怎样 如何 多少 哪 哪个 哪些 可以 能 能不能 会 不会 吗? 请 帮 给 "
    "问 下 用户 之前 此前 询问 咨询 了解 又 再 先 后 时候 现在 比较 还是 然后 所以 因为 如果 但是 "
    "对 跟 把 被 让 从 到 为 为什么 呗 咋 啥 嗯 哈".split()
)
EN_STOPWORDS = frozenset(
    "a an the and or of to in on for with is are was be can could do does did i you it my me "
    "what how which who when where why please about".split()
)
_WORD = re.compile(r"\w", re.UNICODE)
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
# Particles that make bigrams like "了氨" noise.
_BIGRAM_SKIP = frozenset("的了吗呢吧啊呀嘛哦么是我你他她它这那就都也还和与或在有要想请问下个")


def normalize(text: str) -> str:
    """NFKC (full-width → half-width), lower-case, collapse whitespace."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    return re.sub(r"\s+", " ", text).strip()


def tokenize(text: str, language: str = "zh") -> list[str]:
    words, bigrams = tokenize_parts(text, language)
    return words + bigrams


def tokenize_parts(text: str, language: str = "zh") -> tuple[list[str], list[str]]:
    """(words, CJK bigrams): bigrams are a matching aid, not query content (see rag/local.py)."""
    text = normalize(text)
    if language == "zh":
        tokens = jieba.lcut_for_search(text)
        stop = ZH_STOPWORDS
    else:
        tokens = re.findall(r"[a-z0-9]+", text)
        stop = EN_STOPWORDS
    words = [t for t in (tok.strip() for tok in tokens) if t and _WORD.search(t) and t not in stop]
    bigrams: list[str] = []
    if language == "zh":
        # jieba segments the same name differently by context ("了氨糖的" → 氨/糖, but 氨糖 in the KB):
        # overlapping CJK bigrams make matching independent of segmentation.
        bigrams = [a + b for run in _CJK_RUN.findall(text) for a, b in zip(run, run[1:])
                  if a + b not in stop and a not in _BIGRAM_SKIP and b not in _BIGRAM_SKIP]
    return words, bigrams


def with_history(text: str, row: dict) -> str:
    """`text` with the row's history summary pasted after it: query_history's rule, and a model's rewrite under
    the decoding lever append_history (qrewrite.runtime.route)."""
    return f"{text} {row.get('history') or ''}".strip()
