"""Teacher rewrites: an OpenAI-compatible LLM (`openai`) or RM3 pseudo-relevance feedback (`prf`)."""
