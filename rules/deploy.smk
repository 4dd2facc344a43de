# Serving check, not part of `rule all`: `snakemake deploy` serves each tenant's deploy.candidate model (the
# RL model) as an OpenAI-compatible endpoint on loopback, sends the eval split through it and the RAG
# provider, and writes reports/T/deploy.json (latency, throughput, Hit@1 vs the in-process eval, the
# production command). It measures a machine rather than making an artifact another stage uses.
# Its helpers (deploy_targets, deploy_model, deploy_rewrites) are in rules/common.smk.

rule deploy_check:
    """Serve the model on loopback, the eval rows through it at each concurrency level, Hit@1 through the RAG."""
    input:
        model=deploy_model,
        test=T(EVAL["split"]),
        queries=T("queries"),
        eval_json=E("eval_json"),
        rewrites=deploy_rewrites,
    output:
        deploy_json("{tenant}"),
    params:
        config=RESOLVED_CONFIG,
        deploy=DEPLOY,
        generation=EVAL["generation"],
        max_rows=EVAL["max_rows"],
    log:
        cmd="logs/{tenant}/deploy.log",
        server="logs/{tenant}/deploy_server.log",
    threads: config["train"]["threads"]
    resources:
        mem_mb=16000,
        runtime=60,
    container:
        CONTAINERS["swift"]
    conda:
        CONDA_ENVS["swift"]
    shell:
        logged("qrewrite deploy-check --config {params.config} --tenant {wildcards.tenant} --model {input.model}"
               " --test {input.test} --queries {input.queries} --eval-json {input.eval_json}"
               " --eval-rewrites {input.rewrites} --server-log {log.server} --threads {threads} --out {output}"
               " 2> {log.cmd}")
