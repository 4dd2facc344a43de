# qrewrite: raw Excel → teacher rewrites → RAG validation → SFT splits → LoRA SFT → RL (→ eval).
# Rules are thin: each calls one `qrewrite` subcommand; the logic lives in the qrewrite package.

configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/eval.smk"
include: "rules/deploy.smk"


rule all:
    input:
        all_targets(),
    default_target: True


# Partial targets: `snakemake data` (data half only), `snakemake models` (up to the RL models).
rule data:
    input:
        data_targets(),


rule models:
    input:
        data_targets() + model_targets(),


# Serving check (not in `all`: it measures the machine, no stage uses it): reports/T/deploy.json per tenant.
rule deploy:
    input:
        deploy_targets(),
