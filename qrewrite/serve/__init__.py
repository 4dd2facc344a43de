"""The rewrite gateway (`qrewrite serve`): the one endpoint a tenant's RAG service calls, answering what the
eval scored.

* `keys`: each tenant's key from its environment variable; who may ask for whom;
* `requests`: the two request shapes (OpenAI chat completions, the structured /v1/rewrite) → a row, or a 400
  naming the field;
* `backends`: the released model in process (transformers) or behind an OpenAI-compatible server (vLLM, swift);
* `release`: one tenant's release loaded (release.json, its lineage hash, backend, RAG) and how it answers a row
  (qrewrite.runtime.route applies the client step, as in the release stage and the eval);
* `registry`: every served tenant's release, swapped in when its folder changes or on SIGHUP;
* `app`: the FastAPI application, the access log;
* `plan`: the production command lines (vLLM with one LoRA adapter per tenant on a shared base, the gateway,
  a Slurm batch script);
* `cli`: `qrewrite serve`, `qrewrite serve-plan`.
"""
