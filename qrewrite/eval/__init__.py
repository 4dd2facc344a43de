"""Evaluation of rewrite candidates on a tenant's test split.

Two steps per tenant (each rule runs the `qrewrite` subcommand of its name):

1. `qrewrite eval-generate` (rule `eval_generate`) or `qrewrite eval-rewrites` (rule `eval_rewrites`): one
   candidate's rewrite of every test query, with its latency and cost. eval-generate: `model` (a local HF
   model, greedy decoding with plain transformers in the ms-swift env; the prompt is exactly the SFT prompt);
   eval-rewrites: `raw` (the query itself), `teacher` (the data half's teacher rows), `openai` (any
   OpenAI-compatible API, cached).
2. `qrewrite eval` (rule `eval`): every candidate's rewrites through the tenant's RAG service and the
   reward's judge → `reports/T/eval.json` (metrics with bootstrap intervals, paired comparisons, win / tie /
   loss against the baseline, latency, cost), `reports/T/examples.jsonl` and `reports/T/plots.json`.
"""
