"""The release stage: what a tenant gets, chosen on the validation split only (`qrewrite release`).

* `select`: the choosing rule, a pure function of the candidates' validation scores;
* `score`: the candidates' validation rewrites and their tie-aware Hit@1 through the tenant's RAG;
* `folder`: models/T/release: release.json, the chosen model's files (linked) or none for a rule, lineage.json;
* `cli`: the command.
"""
