"""What a release does with one request, the one runtime that the release stage and the eval score and the gateway
serves:

* `rules`: the texts sent without a model (raw, query + history);
* `generate`: the model's greedy rewrite (transformers; the prompt SFT trained on), finished as RL scored it;
* `degenerate`: when a model's text is not a rewrite (empty, a loop, cut);
* `route`: the client step after a model's rewrite (the empty fallback, append_history, route_by_retrieval);
* `engine`: one model's requests batched, with a bounded queue (admission answered at once);
* `backends`: where a served model's rewrite comes from (in process through the engine, or an OpenAI-compatible
  server such as vLLM, with the release's adapter loaded at swap time);
* `release`: a release folder loaded whole (its files checked against its lineage, one warm-up request) and how it
  answers a row.
"""
