"""qrewrite: train small query-rewrite models for RAG from a tenant's query test set."""

from pathlib import Path

__version__ = "0.1.0"

# The code checkout: envs/, containers/, the wheel pins and .venvs/ live here (not the working directory,
# which holds a run's data and may be elsewhere).
REPO = Path(__file__).resolve().parents[1]
