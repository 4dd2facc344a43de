"""Local BM25 retriever (bm25s + jieba) with a reranker-like score in [0, 1].

Normalisation (documented in the README): for query terms t (with repeats),

    reranker_score(q, d) = min(1, BM25(q, d) / sum_t idf(t) / (1 + k1))

The denominator is the BM25 score a document of average length would get if it contained every
query term exactly once, so 1.0 means "covers the whole query" and terms missing from the document,
including typos the KB has never seen (which get the highest idf), pull the score down. Unlike a
raw BM25 score it does not grow just because a query got longer. For Chinese, CJK bigrams match
(they make matching independent of jieba's segmentation) but a bigram the KB has never seen is a
segmentation artefact ("天怎"), not query content, so it is left out of the denominator.
"""

from __future__ import annotations

import math
import os
from collections import Counter

# bm25s runs a jax op at import when jax is installed; on a GPU box XLA would then preallocate 75 % of the
# GPU in every process that scores rewards, starving the trainer (seen on an H100, docs/gpu-check.md).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import bm25s  # noqa: E402
import numpy as np

from ..kb import Doc
from ..text import tokenize, tokenize_parts


class LocalRetriever:
    def __init__(self, docs: list[Doc], language: str = "zh", k1: float = 1.5, b: float = 0.75):
        self.docs = docs
        self.language = language
        self.k1 = k1
        self.doc_tokens = [tokenize(d.text, language) for d in docs]
        self.bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self.bm25.index(self.doc_tokens, show_progress=False)
        df = Counter(t for toks in self.doc_tokens for t in set(toks))
        n = len(docs)
        # Lucene idf, as bm25s uses for method="lucene"; unseen terms get df = 0.
        self._df = dict(df)
        self._idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        self._idf_unseen = math.log(1 + (n + 0.5) / 0.5)

    def df(self, term: str) -> int:
        return self._df.get(term, 0)

    def idf(self, term: str) -> float:
        return self._idf.get(term, self._idf_unseen)

    def term_scores(self, term: str) -> np.ndarray:
        if term not in self._idf:
            return np.zeros(len(self.docs), dtype=np.float32)
        return np.asarray(self.bm25.get_scores([term]), dtype=np.float32)

    def weighted_scores(self, weights: dict[str, float], aids: frozenset = frozenset()) -> tuple[np.ndarray, float]:
        """BM25 scores for a weighted bag of terms, and the normalising reference score.

        `aids` are matching-only terms (CJK bigrams): they count in the reference only if the KB has them.
        """
        scores = np.zeros(len(self.docs), dtype=np.float32)
        ref = 0.0
        for term, w in weights.items():
            scores += w * self.term_scores(term)
            if term not in aids or term in self._idf:
                ref += w * self.idf(term) / (1 + self.k1)
        return scores, ref

    def search_terms(self, weights: dict[str, float], top_k: int, score_threshold: float = 0.0,
                     aids: frozenset = frozenset()) -> list[dict]:
        scores, ref = self.weighted_scores(weights, aids)
        if ref <= 0:
            return []
        order = np.argsort(-scores, kind="stable")[:top_k]
        hits = []
        for i in order:
            raw = float(scores[i])
            if raw <= 0:
                break
            norm = min(1.0, raw / ref)
            if norm < score_threshold:
                continue
            d = self.docs[i]
            hits.append({"doc_id": d.doc_id, "content": d.content, "reranker_score": round(norm, 6),
                         "bm25": round(raw, 6)})
        return hits

    def search(self, query: str, top_k: int = 5, score_threshold: float = 0.0) -> list[dict]:
        words, bigrams = tokenize_parts(query, self.language)
        return self.search_terms(dict(Counter(words + bigrams)), top_k, score_threshold,
                                 aids=frozenset(bigrams) - set(words))
