"""qrewrite: train small query-rewrite models for RAG from a tenant's query test set."""

__version__ = "0.1.0"
