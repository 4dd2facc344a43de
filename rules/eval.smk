# Evaluation and report: every eval candidate's rewrites of the test split → per-tenant metrics → one HTML report.
# Candidates are config entries (eval.candidates): kind model runs in the swift env/container (transformers),
# the others (raw, teacher, openai API) in the cpu one. `snakemake --report` includes the eval outputs.

if MODEL_CANDIDATES:

    rule eval_generate:
        """A local model's rewrites (greedy, the SFT prompt) with per-query latency and GPU-hour cost."""
        input:
            model=eval_model,
            test=T(EVAL["split"]),
            queries=T("queries"),
            gold_set=optional("gold_set"),
            red_team=optional("red_team"),
        output:
            E("rewrites"),
        wildcard_constraints:
            candidate="|".join(MODEL_CANDIDATES),
        params:
            config=RESOLVED_CONFIG,
            candidate=lambda wc: CANDIDATES[wc.candidate],
            generation=EVAL["generation"],
            max_rows=EVAL["max_rows"],
            gpu_hour_usd=EVAL["gpu_hour_usd"],
        log:
            "logs/{tenant}/eval_{candidate}.log",
        benchmark:
            "benchmarks/{tenant}/eval_{candidate}.tsv"
        threads: config["train"]["threads"]
        resources:
            mem_mb=16000,
            runtime=120,
        container:
            CONTAINERS["swift"]
        conda:
            CONDA_ENVS["swift"]
        shell:
            logged("qrewrite eval-generate --config {params.config} --tenant {wildcards.tenant} --candidate {wildcards.candidate}"
                   " --test {input.test} --queries {input.queries} --model {input.model} --threads {threads}"
                   " --out {output} 2> {log}")


if OTHER_CANDIDATES:

    rule eval_rewrites:
        """The raw query, the recorded teacher rewrites, or an API candidate's rewrites (cached calls)."""
        input:
            test=T(EVAL["split"]),
            queries=T("queries"),
            teacher=T("teacher"),
            kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],  # the teacher rewrites gold/red-team rows it has not seen
            gold_set=optional("gold_set"),
            red_team=optional("red_team"),
        output:
            E("rewrites"),
        wildcard_constraints:
            candidate="|".join(OTHER_CANDIDATES),
        params:
            config=RESOLVED_CONFIG,
            candidate=lambda wc: CANDIDATES[wc.candidate],
            max_rows=EVAL["max_rows"],
        log:
            "logs/{tenant}/eval_{candidate}.log",
        benchmark:
            "benchmarks/{tenant}/eval_{candidate}.tsv"
        resources:
            mem_mb=2000,
            runtime=60,
        container:
            CONTAINERS["cpu"]
        conda:
            CONDA_ENVS["cpu"]
        shell:
            logged("qrewrite eval-rewrites --config {params.config} --tenant {wildcards.tenant} --candidate {wildcards.candidate}"
                   " --test {input.test} --queries {input.queries} --teacher {input.teacher} --out {output} 2> {log}")


rule eval:
    """Retrieval vs gold, reranker scores, judge, win/tie/loss, latency, cost, paired intervals."""
    input:
        test=T(EVAL["split"]),
        queries=T("queries"),
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
        judge_labels=lambda wc: TENANTS[wc.tenant]["judge_labels"] or [],
        gold_set=optional("gold_set"),
        red_team=optional("red_team"),
        rewrites=eval_rewrites_of,
    output:
        eval_json=report(E("eval_json"), category="Evaluation", subcategory="{tenant}", labels={"tenant": "{tenant}", "file": "eval.json"}),
        examples=report(E("examples"), category="Evaluation", subcategory="{tenant}", labels={"tenant": "{tenant}", "file": "examples.jsonl"}),
        plots=report(E("plots"), category="Evaluation", subcategory="{tenant}", labels={"tenant": "{tenant}", "file": "plots.json"}),
    params:
        config=RESOLVED_CONFIG,
        eval=EVAL,
        reward=config["reward"],
        rag=config["rag"],
    log:
        "logs/{tenant}/eval.log",
    benchmark:
        "benchmarks/{tenant}/eval.tsv"
    resources:
        mem_mb=2000,
        runtime=30,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite eval --config {params.config} --tenant {wildcards.tenant} --test {input.test}"
               " --queries {input.queries} --rewrites {input.rewrites} --out {output.eval_json}"
               " --examples {output.examples} --plots {output.plots} 2> {log}")


rule report:
    """reports/index.html over every tenant: tables, metric bars, training curves, data funnel, lineage."""
    input:
        eval_json=[eval_paths(t)["eval_json"] for t in TENANTS],
        examples=[eval_paths(t)["examples"] for t in TENANTS],
        summary=[tenant_paths(t)["summary"] for t in TENANTS],
        data_card=[tenant_paths(t)[k] for t in TENANTS for k in ("data_card", "data_card_json")],
        tb=[tenant_paths(t)[k] for t in TENANTS for k in ("tb_sft", "tb_rl")],
    output:
        report(REPORT_HTML, category="Report", labels={"file": "index.html"}),
    params:
        config=RESOLVED_CONFIG,
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    resources:
        mem_mb=1000,
        runtime=10,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite report --config {params.config} --out {output} 2> {log}")
