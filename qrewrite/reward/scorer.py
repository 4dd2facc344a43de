"""Score a batch of student rewrites: retrieval through the tenant's RAG provider, judge, formula.

The teacher side comes from the precomputed ground truth (teacher rewrite, teacher top1 /
mean_top3 / hits, gold ids): RL makes no teacher calls. Only if the ground truth lacks the
teacher's retrieval numbers is the teacher rewrite retrieved (cached like any rewrite); with no
teacher rewrite either, the raw query's retrieval is the baseline.

Caches: student (and fallback teacher) retrievals in memory and on disk under
``reward.cache_dir/rag``, keyed by provider, tenant, rewrite and whatever else changes the result
(top_k, score threshold; KB fingerprint and BM25 parameters for the local provider; endpoint and raw
query for the HTTP provider, which receives both). Judge verdicts in memory, and the OpenAI judge's
replies on disk under ``reward.cache_dir/judge``. Counters (``stats()``) report calls and hits.

Async inside (bounded concurrency via the RAG client's semaphore and the judge's), synchronous
outside: ``score_batch`` runs the coroutines on one private event-loop thread, so it can be called
from any thread (verl runs the reward function in an executor; ms-swift calls it synchronously) and
the HTTP clients always live on the same loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..io_utils import sha256_json
from ..metrics import gold_ranking, quality_from_parts, retrieval_quality, tie_groups
from ..rag.local import SCORE_VERSION
from ..rag.providers import make_rag
from ..cache import DiskCache
from . import formula, reward_settings
from .judges import make_tenant_judge
from .verdict import Verdict, judge_sampled

log = logging.getLogger(__name__)


@dataclass
class RewardSample:
    """One rollout to score, with its query's precomputed teacher side."""

    query_id: str
    query: str
    rollout: str
    teacher_rewrite: str | None = None
    teacher_top1: float | None = None
    teacher_mean_top3: float | None = None
    teacher_hits: list[dict] | None = None     # with reranker_score, if the ground truth carries them
    gold_doc_ids: list[str] = field(default_factory=list)
    profile: str = ""
    history: str = ""
    red_team: dict | None = None               # {attack, expect} of a red-team row: the checks are the reward


# ------------------------------------------------------------------------------ rollout text cleanup

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_END_OF_TURN = re.compile(r"<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<\|end\|>|<end_of_turn>|</s>|<\|eos\|>|<eos>",
                          re.IGNORECASE)
_ROLE_HEADER = re.compile(r"<\|im_start\|>\s*(assistant|user|system)?\s*|<\|start_header_id\|>\s*\w*\s*"
                          r"<\|end_header_id\|>\s*|<start_of_turn>\s*(model|user)?\s*", re.IGNORECASE)
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>|</?s>|<bos>|\[/?INST\]")


def clean_rollout(text: str | None) -> str:
    """The rewrite inside a decoded completion: drop think blocks and chat-template tokens.

    ``<think>...</think>`` is removed; text before a lone ``</think>`` (opened in the prompt) is
    reasoning and dropped; a ``<think>`` never closed (truncated reasoning) drops everything from it.
    Everything after the first end-of-turn token is dropped; role headers and other special tokens
    are removed. Lines are kept as they are, so the judge still sees a multi-line answer.
    """
    t = text or ""
    t = _THINK_BLOCK.sub("", t)
    low = t.lower()
    if "</think>" in low:
        t = t[low.rindex("</think>") + len("</think>"):]
        low = t.lower()
    if "<think>" in low:
        t = t[:low.index("<think>")]
    t = _ROLE_HEADER.sub("", t)
    m = _END_OF_TURN.search(t)
    if m and t[:m.start()].strip():
        t = t[:m.start()]
    t = _END_OF_TURN.sub("", t)
    t = _SPECIAL.sub("", t)
    return t.strip()


def _file_fingerprint(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


MEMO_CAP = 200_000
LOG_EVERY = 512
# Scorer counters, always reported (training logs can rely on the keys): rollouts scored; RAG calls
# made / answered from memory / from disk / skipped (empty rewrite); teacher-side retrievals needed
# because the ground truth lacked them; judged / unjudged rollouts; judged rollouts whose judge
# failed (term 0); judge requests issued / answered by the in-memory memo. The judge adds its own
# judge_calls, judge_cache_hits, judge_failures[_<kind>].
STAT_KEYS = ("samples", "rag_calls", "rag_cache_hits", "rag_disk_hits", "rag_skipped_empty",
             "teacher_retrieval_fallback", "judge_sampled", "judge_unsampled", "judge_failed_samples",
             "judge_requests", "judge_memo_hits", "red_team_samples")


def _bounded_put(memo: dict, key, value, cap: int = MEMO_CAP) -> None:
    """Insert, dropping the oldest half (finished entries only) once ``cap`` is reached: a long RL
    run must not grow memory without bound; the disk caches still hold everything."""
    if len(memo) >= cap:
        for k in list(memo)[: cap // 2]:
            v = memo[k]
            if not isinstance(v, asyncio.Future) or v.done():
                del memo[k]
    memo[key] = value


class _LoopThread:
    """One event loop running forever on a daemon thread; ``run`` blocks the caller until done."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="qrewrite-reward-loop", daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class RewardScorer:
    """Scores rollouts of one tenant; see the module docstring. ``cfg`` is a validated config."""

    def __init__(self, cfg: dict, tenant: dict, *, rag=None, judge=None):
        self.cfg, self.tenant = cfg, tenant
        self.settings = reward_settings(cfg)
        self.weights = self.settings["weights"]
        self.epsilon = float(self.settings["epsilon"])
        self.sample_share = float(self.settings["judge"]["sample_share"])
        self.quality = (cfg.get("rag") or {}).get("quality", "top1")
        self.rank_label = self.settings.get("rank_label", "auto")
        self.language = tenant.get("language", "zh")
        self.rag = rag if rag is not None else make_rag(cfg, tenant)
        rcfg = cfg["rag"]
        self._rag_ident = {"provider": rcfg["provider"], "tenant": tenant["name"], "top_k": rcfg["top_k"],
                           "score_threshold": rcfg["score_threshold"]}
        if rcfg["provider"] == "http":
            self._rag_ident.update(endpoint=rcfg["http"]["base_url"].rstrip("/") + rcfg["http"]["path"],
                                   kb_name=tenant["kb"]["name"], tenant_id=tenant.get("tenant_id"))
        else:
            self._rag_ident.update(kb=_file_fingerprint(tenant["kb"]["path"]), local=rcfg.get("local"),
                                   score_version=SCORE_VERSION)
        cache_dir = Path(self.settings["cache_dir"])
        self.rag_disk = DiskCache(cache_dir / "rag")
        self._rag_mem: dict[str, list[dict]] = {}
        self.judge = judge if judge is not None else make_tenant_judge(self.settings, tenant, str(cache_dir), self.rag)
        self._verdicts: dict[tuple, asyncio.Task] = {}
        self._loop: _LoopThread | None = None
        self._lock = threading.Lock()
        self.counters: Counter = Counter({k: 0 for k in STAT_KEYS})

    # -------------------------------------------------------------------------------- retrieval
    def _rag_key(self, query: str, rewrite: str) -> str:
        # The raw query changes the answer of both providers: the HTTP service receives it, and the local score
        # multiplies by how much of it a document covers. Two questions with the same rewrite are two entries.
        return sha256_json(dict(self._rag_ident, rewrite=rewrite, query=query))

    async def retrieve(self, query: str, rewrite: str) -> list[dict]:
        """Hits ({doc_id, reranker_score}, best first) for ``rewrite``; cached in memory and on disk."""
        if not rewrite.strip():
            self.counters["rag_skipped_empty"] += 1
            return []
        key = self._rag_key(query, rewrite)
        if key in self._rag_mem:
            self.counters["rag_cache_hits"] += 1
            return self._rag_mem[key]
        entry = self.rag_disk.get(key)
        if entry is not None and isinstance(entry.get("hits"), list):
            self.counters["rag_disk_hits"] += 1
            hits = entry["hits"]
        else:
            self.counters["rag_calls"] += 1
            raw = await self.rag.search(query, rewrite)
            hits = [{"doc_id": str(h["doc_id"]), "reranker_score": float(h["reranker_score"])} for h in raw]
            self.rag_disk.put(key, {"hits": hits})
        _bounded_put(self._rag_mem, key, hits)
        return hits

    async def _teacher_side(self, s: RewardSample) -> tuple[float, float]:
        """(q_teacher, teacher_top1) from the ground truth, else by retrieving the teacher rewrite."""
        if s.teacher_hits and all("reranker_score" in h for h in s.teacher_hits):
            hits = sorted(s.teacher_hits, key=lambda h: -float(h["reranker_score"]))
            return retrieval_quality(hits, self.quality), float(hits[0]["reranker_score"])
        if s.teacher_top1 is not None and s.teacher_mean_top3 is not None:
            return (quality_from_parts(s.teacher_top1, s.teacher_mean_top3, self.quality),
                    float(s.teacher_top1))
        self.counters["teacher_retrieval_fallback"] += 1
        hits = await self.retrieve(s.query, s.teacher_rewrite or s.query)
        return retrieval_quality(hits, self.quality), (float(hits[0]["reranker_score"]) if hits else 0.0)

    # ------------------------------------------------------------------------------------ judge
    async def _verdict(self, kind: str, s: RewardSample, text: str) -> Verdict:
        key = (kind, s.query_id, text)
        task = self._verdicts.get(key)
        if task is None:
            self.counters["judge_requests"] += 1
            task = asyncio.ensure_future(self.judge.judge(s.query, s.profile, s.history, text, s.teacher_rewrite))
            _bounded_put(self._verdicts, key, task)
        else:
            self.counters["judge_memo_hits"] += 1
        try:
            return await asyncio.shield(task)
        except Exception:
            self._verdicts.pop(key, None)  # a crashed judge call (config error) is not memoised
            raise

    async def _judge_pair(self, s: RewardSample) -> tuple[float | None, float | None, bool]:
        """(judge_student, judge_teacher, failed); both None when unsampled or failed."""
        if not judge_sampled(s.query_id, s.rollout, self.sample_share):
            self.counters["judge_unsampled"] += 1
            return None, None, False
        self.counters["judge_sampled"] += 1
        if not (s.teacher_rewrite or "").strip():
            self.counters["judge_failed_samples"] += 1
            return None, None, True
        student, teacher = await asyncio.gather(self._verdict("student", s, s.rollout),
                                                self._verdict("teacher", s, s.teacher_rewrite))
        if not (student.ok and teacher.ok):
            self.counters["judge_failed_samples"] += 1
            return None, None, True
        return student.score, teacher.score, False

    # ------------------------------------------------------------------------------------ score
    def rank_target(self, s: RewardSample) -> tuple[list[str], str | None]:
        """(documents the rank term ranks, their kind: gold | teacher | None), per ``reward.rank_label``."""
        if s.gold_doc_ids and self.rank_label in ("auto", "gold"):
            return list(s.gold_doc_ids), "gold"
        if self.rank_label in ("auto", "teacher") and s.teacher_hits:
            groups = tie_groups([h for h in s.teacher_hits if "reranker_score" in h])
            if groups and len(groups[0]) == 1:  # a tied top is no label
                return [groups[0][0]["doc_id"]], "teacher"
        return [], None

    async def _score_one(self, s: RewardSample) -> dict:
        if s.red_team:  # adversarial row: no teacher side; the pure checks grade the rollout
            from ..data.red_team import check_rewrite

            self.counters["samples"] += 1
            self.counters["red_team_samples"] += 1
            return formula.red_team_reward_dict(check_rewrite(s.rollout, s.red_team["expect"]))
        hits, (q_teacher, teacher_top1), (j_s, j_t, failed) = await asyncio.gather(
            self.retrieve(s.query, s.rollout), self._teacher_side(s), self._judge_pair(s))
        self.counters["samples"] += 1
        target, label = self.rank_target(s)
        rr = gold_ranking(hits, target)["rr"] if target else None
        return formula.reward_dict(
            q_student=retrieval_quality(hits, self.quality), q_teacher=q_teacher,
            student_top1=float(hits[0]["reranker_score"]) if hits else 0.0, teacher_top1=teacher_top1,
            judge_student=j_s, judge_teacher=j_t, weights=self.weights, epsilon=self.epsilon,
            judge_failed=failed, rank_rr=rr, rank_label=label)

    async def ascore_batch(self, samples: list[RewardSample]) -> list[dict]:
        """Score ``samples`` concurrently. Use this or ``score_batch``, not both on one scorer."""
        return list(await asyncio.gather(*(self._score_one(s) for s in samples)))

    def run(self, coro):
        """Run ``coro`` on the scorer's own event-loop thread and return its result: the judge's and the RAG's
        HTTP clients live on that loop, so anything else that uses them (the reward check) runs there too."""
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
        return self._loop.run(coro)

    def score_batch(self, samples: list[RewardSample]) -> list[dict]:
        """Synchronous face of ``ascore_batch`` (callable from any thread, even inside a running loop's
        executor); runs on the scorer's own event-loop thread."""
        before = self.counters["samples"]
        out = self.run(self.ascore_batch(samples))
        # verl scores one sample per call: report counters every LOG_EVERY samples, not every call.
        if self.counters["samples"] // LOG_EVERY > before // LOG_EVERY:
            log.info("qrewrite reward [%s]: %s", self.tenant["name"], self.stats())
        return out

    def stats(self) -> dict:
        """Cumulative counters: rag_calls, rag cache hits, judge calls, judge cache hits, failures..."""
        judge_stats = self.judge.stats() if hasattr(self.judge, "stats") else {}
        return {**{k: self.counters[k] for k in STAT_KEYS}, **judge_stats,
                "judge_provider": getattr(self.judge, "provider", "?")}

    async def aclose(self):
        await self.rag.aclose()
        await self.judge.aclose()

    def close(self):
        if self._loop is not None:
            self._loop.run(self.aclose())
            self._loop.stop()
            self._loop = None

