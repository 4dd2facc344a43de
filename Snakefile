# qrewrite: raw Excel → teacher rewrites → RAG validation → SFT splits (→ SFT → RL → eval, later stages).
# Rules are thin: each calls one `qrewrite` subcommand; the logic lives in the qrewrite package.

configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"


rule all:
    input:
        all_targets(),
    default_target: True
