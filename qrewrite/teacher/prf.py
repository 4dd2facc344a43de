"""The embedded default teacher: RM3 pseudo-relevance-feedback query expansion over the tenant KB.

Not an LLM. It builds a weighted query from the question plus (down-weighted) profile and history
terms, retrieves the top `fb_docs` KB documents with BM25, estimates a relevance model from them and
appends the `fb_terms` strongest expansion terms to the question. Context and expansion terms must
be specific: a term found in more than `max_term_df` of the KB documents (an aspect word like
"适用人群", FAQ boilerplate) is not carried over, so a history's product name is, but not its topic.
Expansion weights are scaled by idf for the same reason. Deterministic and fast; it resolves
"那它孕妇能吃吗" only as far as the history names the product. Point `teacher.provider: openai` at a
real LLM for real rewrites.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..rag.local import LocalRetriever
from ..text import normalize, tokenize


class PrfTeacher:
    provider = "prf"
    model = "rm3-bm25"

    def __init__(self, retriever: LocalRetriever, prf_cfg: dict):
        self.retriever = retriever
        self.cfg = prf_cfg
        self.language = retriever.language

    def _specific(self, term: str) -> bool:
        if term.isdigit():
            return False
        return self.retriever.df(term) <= self.cfg["max_term_df"] * len(self.retriever.docs)

    @property
    def params(self) -> dict:
        return dict(self.cfg)

    def rewrite(self, query: str, profile: str, history: str) -> str:
        lang, cfg = self.language, self.cfg
        q_terms = Counter(tokenize(query, lang))
        weights: Counter = Counter()
        for terms, w in ((q_terms, 1.0), (Counter(tokenize(history, lang)), cfg["history_weight"]),
                         (Counter(tokenize(profile, lang)), cfg["profile_weight"])):
            for t, c in terms.items():
                if w == 1.0 or self._specific(t):
                    weights[t] += w * c
        scores, _ = self.retriever.weighted_scores(dict(weights))
        order = [i for i in np.argsort(-scores, kind="stable")[: cfg["fb_docs"]] if scores[i] > 0]
        text = normalize(query)
        if not order or cfg["fb_terms"] == 0:
            return text
        # Relevance model P(t|F): document language models weighted by normalised retrieval score.
        doc_w = scores[order] / scores[order].sum()
        rel: Counter = Counter()
        for w, i in zip(doc_w, order):
            toks = self.retriever.doc_tokens[i]
            for t, c in Counter(toks).items():
                rel[t] += float(w) * c / len(toks)
        total_q = sum(weights.values())
        lam = cfg["original_weight"]
        mixed = {t: (lam * weights.get(t, 0.0) / total_q + (1 - lam) * rel.get(t, 0.0)) * self.retriever.idf(t)
                 for t in set(weights) | set(rel)}
        # Expansion: strongest specific terms not already in the question; single characters are too vague.
        candidates = sorted((t for t in mixed if t not in q_terms and len(t) > 1 and t not in text
                             and self._specific(t)), key=lambda t: (-mixed[t], t))
        expansion = candidates[: cfg["fb_terms"]]
        return f"{text} {' '.join(expansion)}".strip()
