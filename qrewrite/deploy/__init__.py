"""Serving check: the trained rewriter behind an OpenAI-compatible endpoint (`qrewrite deploy-check`)."""
