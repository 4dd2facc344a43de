"""Is a generated rewrite one, or output a small model degenerated into? Pure functions; every place that
generates rewrites (eval, the rl stage's parent check, the deploy check) asks the same question.

Reasons, checked in this order:

* ``empty``: nothing but whitespace and punctuation;
* ``loop``: a run of 4 units repeated 3 times ("复合维生素B片复合维生素C片复合维生素D片…", "乳清蛋白粉粉粉粉…"), or twice
  in a rewrite the token cap cut off; a unit is a CJK character or a Latin word, so "the … the … the" in a long
  English sentence is not one;
* ``overlong``: more units than the question, profile and history it was made from together, plus 12;
* ``unfinished``: cut by ``max_new_tokens`` and longer than its source. A long rewrite of a long question cut by the
  cap is not counted: on CQR all 9 such test rewrites still put the gold document first (docs/training.md).

A loop is trimmed where it is generated (``trim_loop``, ``eval.generation.trim_loops``, on by default): the rewrite
ends where the loop began, as if generation had stopped at it, and eval.json counts such rewrites per model
(``loops_trimmed``); the model's raw completion is kept beside it.

The fallback for a degenerate rewrite is the query with its history pasted after it (the `query_history`
baseline, free and never worse than the raw query on any tenant measured): eval reports it beside the model's own
figures (``with_fallback``), never inside them.
"""

from __future__ import annotations

import re

REASONS = ("empty", "loop", "overlong", "unfinished")
_UNIT = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
LOOP_N, LOOP_TIMES, OVERLONG_MARGIN = 4, 3, 12


def units(text: str) -> list[str]:
    """CJK characters and Latin words/numbers, lower-cased; punctuation and spaces dropped."""
    return [u.lower() for u in _UNIT.findall(text or "")]


def _looping_run(u: list[str], n: int, times: int) -> list[int] | None:
    """The unit positions of the first run of `n` units that occurs `times` times in `u`, or None."""
    at: dict[tuple, list[int]] = {}
    for i in range(len(u) - n + 1):
        at.setdefault(tuple(u[i:i + n]), []).append(i)
    looping = [pos for pos in at.values() if len(pos) >= times]
    return min(looping, key=lambda pos: pos[0]) if looping else None


def has_loop(text: str, n: int = LOOP_N, times: int = LOOP_TIMES) -> bool:
    return _looping_run(units(text), n, times) is not None


def degeneracy(rewrite: str, *, source: str, finished: bool | None = None) -> str | None:
    """Why `rewrite` is not a rewrite (one of REASONS), or None. `source`: the question, profile and history it was
    made from; `finished`: whether generation ended its turn before max_new_tokens (None: unknown, not checked)."""
    u, n_source = units(rewrite), len(units(source))
    if not u:
        return "empty"
    if has_loop(rewrite) or (finished is False and has_loop(rewrite, times=2)):
        return "loop"
    if len(u) > n_source + OVERLONG_MARGIN:
        return "overlong"
    if finished is False and len(u) > n_source:
        return "unfinished"
    return None


def trim_loop(text: str, n: int = LOOP_N, times: int = LOOP_TIMES) -> str:
    """`text` cut where it starts to repeat itself: before the second occurrence of the first run of `n` units that
    occurs `times` times ("深海鱼软胶囊软胶囊软胶囊…" → "深海鱼软胶囊", "复合维生素B片复合维生素C片复合维生素D片…" →
    "复合维生素B片"). Generation would have stopped there had it checked for a loop as it went; what followed is
    dropped with the loop. Text without a loop comes back unchanged."""
    found = list(_UNIT.finditer(text or ""))
    run = _looping_run([m.group().lower() for m in found], n, times)
    if run is None:
        return text
    return text[:found[run[1]].start()].rstrip(" ,，、;；:：")


def source_text(row: dict) -> str:
    return " ".join(str(row.get(k) or "") for k in ("query", "profile", "history"))


def fallback(row: dict) -> str:
    """What is served instead of a degenerate rewrite: the query with the history pasted after it."""
    return f"{row['query']} {row.get('history') or ''}".strip()


def summarize(reasons: list[str | None], ids: list[str] | None = None, examples: list[str] | None = None) -> dict:
    """{n, share, by_reason, examples}: a model's degenerate rewrites, for eval.json / stats."""
    bad = [i for i, r in enumerate(reasons) if r]
    out = {"n": len(bad), "share": round(len(bad) / len(reasons), 4) if reasons else 0.0,
           "by_reason": {r: reasons.count(r) for r in REASONS if reasons.count(r)}}
    if ids is not None:
        out["examples"] = [{"query_id": ids[i], "reason": reasons[i],
                            **({"rewrite": examples[i][:120]} if examples else {})} for i in bad[:5]]
    return out
