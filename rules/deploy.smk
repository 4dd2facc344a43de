# Serving check, not part of `rule all`: `snakemake deploy` serves each tenant's deploy.candidate model (the
# RL model) as an OpenAI-compatible endpoint on loopback, sends the eval split through it and the RAG
# provider, and writes reports/T/deploy.json (latency, throughput, Hit@1 vs the in-process eval, the
# production command). It measures a machine rather than making an artifact another stage uses.

from qrewrite.deploy import deploy_candidate
from qrewrite.paths import deploy_json

DEPLOY = config["deploy"]


def deploy_targets():
    return [deploy_json(t) for t in SELECTED]


def deploy_model(wc):
    return model_path(deploy_candidate(config), TENANTS[wc.tenant])


def deploy_rewrites(wc):
    return eval_paths(wc.tenant)["rewrites"].format(candidate=deploy_candidate(config)["name"])


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
    shell:
        "qrewrite deploy --config {RESOLVED_CONFIG} --tenant {wildcards.tenant} --model {input.model}"
        " --test {input.test} --queries {input.queries} --eval-json {input.eval_json} --eval-rewrites {input.rewrites}"
        " --server-log {log.server} --threads {threads} --out {output} 2> {log.cmd}" + SHOW_LOG_ON_ERROR
