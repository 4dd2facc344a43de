"""Local BM25 retriever (bm25s + jieba) with a reranker-like score in [0, 1].

``score: relevance`` (default) estimates the probability that a hit is the document the user asks
for, as two factors:

    reranker_score(d) = softmax_T(BM25(rewrite, .))[d]  x  coverage(question, d)

* the softmax over the BM25 scores of the whole KB at temperature T (BM25 units): a rewrite that pins
  down one document puts its mass there; one that matches several equally ("怎么吃" fits every
  product's dosage page) splits it, so a flat result list scores low, and documents tied at the top
  share it equally (ties never favour the one earlier in the KB file);
* coverage = min(1, BM25(question, d) / sum_t idf(t) / (1 + k1)) of the user's own question (the
  raw query, which the RAG service receives beside the rewrite): a document that matches only words
  the rewrite added (a pasted history's "物流发货时间") does not answer what was asked.

Measured against gold on the demo tenants (docs/signals.md): among pairs of texts of which exactly
one puts the gold document alone first, this score prefers that one in 94 % / 97 % of pairs; the seed's
coverage score did so in 31 % / 21 % (59-61 % / 42-43 % under the old file-order ranking).

``score: coverage`` (the seed design, kept for comparison) is coverage(rewrite, d) alone: how much of
the rewrite a document covers. It rewards vague queries (a two-word query is fully "covered" by many
documents), so it must not drive validation gain or RL.

For Chinese, CJK bigrams match (they make matching independent of jieba's segmentation); in the
coverage a bigram the KB has never seen is a segmentation artefact, left out of the denominator.
Hits are the top ``top_k`` by BM25, plus every document tied with the last of them, so tie-aware
metrics (``qrewrite.metrics``) see whole tie groups.
"""

from __future__ import annotations

import copy
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

SCORES = ("relevance", "coverage")
# Part of every cache key of local retrievals: bumped when a score's formula changes.
SCORE_VERSION = 2
QUESTION_MEMO = 4096  # questions whose coverage is kept (a GRPO batch has a few, an eval a few hundred)


class LocalRetriever:
    def __init__(self, docs: list[Doc], language: str = "zh", k1: float = 1.5, b: float = 0.75,
                 score: str = "relevance", temperature: float = 2.0):
        if score not in SCORES:
            raise ValueError(f"unknown local score {score!r} ({' | '.join(SCORES)})")
        self.docs = docs
        self.language = language
        self.k1 = k1
        self.score_kind = score
        self.temperature = float(temperature)
        self._question_memo: dict[str, np.ndarray | None] = {}
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

    def with_score(self, score: str) -> "LocalRetriever":
        """This retriever with another reranker score, sharing its BM25 index."""
        if score not in SCORES:
            raise ValueError(f"unknown local score {score!r} ({' | '.join(SCORES)})")
        other = copy.copy(self)
        other.score_kind = score
        return other

    @staticmethod
    def coverage(scores: np.ndarray, ref: float) -> np.ndarray:
        return np.minimum(1.0, scores / ref) if ref > 0 else np.zeros_like(scores)

    def reranker_scores(self, scores: np.ndarray, ref: float, question_cov: np.ndarray | None = None) -> np.ndarray:
        """Every document's reranker score from its BM25 score (see the module docstring)."""
        cov = self.coverage(scores, ref)
        if self.score_kind == "coverage":
            return cov
        e = np.exp((scores.astype(np.float64) - float(scores.max())) / self.temperature)
        return e / e.sum() * (question_cov if question_cov is not None else cov)

    def search_terms(self, weights: dict[str, float], top_k: int, score_threshold: float = 0.0,
                     aids: frozenset = frozenset(), question_cov: np.ndarray | None = None) -> list[dict]:
        scores, ref = self.weighted_scores(weights, aids)
        if ref <= 0 or not (scores > 0).any():
            return []
        rr = self.reranker_scores(scores, ref, question_cov)
        # Reranked: reranker score descending, as a service reranks what its retriever found (BM25, then
        # doc_id only order the display of equal scores: the metrics treat equal reranker scores as tied).
        key = {int(i): (round(float(rr[i]), 6), float(scores[i])) for i in np.flatnonzero(scores > 0)}
        order = sorted(key, key=lambda i: (-key[i][0], -key[i][1], self.docs[i].doc_id))
        if len(order) > top_k:
            cut = key[order[top_k - 1]][0]
            order = [i for n, i in enumerate(order) if n < top_k or key[i][0] == cut]
        hits = []
        for i in order:
            if key[i][0] < score_threshold:
                continue
            d = self.docs[i]
            hits.append({"doc_id": d.doc_id, "content": d.content, "reranker_score": key[i][0], "bm25": key[i][1]})
        return hits

    def _question_coverage(self, question: str) -> np.ndarray | None:
        """coverage(question, every doc), or None for a question of stopwords alone ("为什么"), which leaves
        the rewrite's own coverage. Memoised: RL retrieves many rollouts of one question (read-only array)."""
        cov = self._question_memo.get(question, False)
        if cov is False:
            q_scores, q_ref = self.weighted_scores(*self._terms(question))
            cov = self.coverage(q_scores, q_ref) if q_ref > 0 else None
            if len(self._question_memo) >= QUESTION_MEMO:
                self._question_memo.clear()
            self._question_memo[question] = cov
        return cov

    def _terms(self, text: str) -> tuple[dict[str, float], frozenset]:
        """Weighted terms of ``text`` and its matching-only CJK bigrams."""
        words, bigrams = tokenize_parts(text, self.language)
        return dict(Counter(words + bigrams)), frozenset(bigrams) - set(words)

    def search(self, text: str, top_k: int = 5, score_threshold: float = 0.0, question: str | None = None) -> list[dict]:
        """Hits for ``text`` (a rewrite, or the question itself); ``question`` is the user's raw query
        when ``text`` is a rewrite of it (the relevance score's coverage factor is taken on it)."""
        weights, aids = self._terms(text)
        question_cov = None
        if question is not None and question != text and self.score_kind == "relevance":
            question_cov = self._question_coverage(question)
        return self.search_terms(weights, top_k, score_threshold, aids=aids, question_cov=question_cov)
