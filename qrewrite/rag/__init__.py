"""Retrieval providers: `local` (BM25 over the tenant KB) and `http` (the tenant's RAG service)."""
