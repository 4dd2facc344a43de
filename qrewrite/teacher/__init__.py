"""Teacher rewrites: an OpenAI-compatible LLM (`openai`), the embedded referent resolver (`resolve`, default)
or RM3 pseudo-relevance feedback (`prf`, keyword expansion)."""
