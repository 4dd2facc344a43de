"""Serving check: the trained rewriter behind an OpenAI-compatible endpoint (`qrewrite deploy-check`)."""

from __future__ import annotations

from ..errors import QrewriteError
from ..eval.candidates import candidate_spec


def deploy_candidate(cfg: dict) -> dict:
    """The eval candidate `deploy.candidate` names; it must be a local model (kind model)."""
    spec = candidate_spec(cfg, cfg["deploy"]["candidate"])
    if spec["kind"] != "model":
        raise QrewriteError(f"deploy.candidate {spec['name']!r} is an eval candidate of kind {spec['kind']}, "
                            "not a local model", hint="name a kind: model candidate, e.g. rl")
    return spec
