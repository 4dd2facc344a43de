# Data half: raw Excel → queries → teacher → validated → SFT splits → summary.


rule build_excel:
    """Demo tenants only: build the raw Excel from its reviewable JSONL source (exercises the Excel reader)."""
    wildcard_constraints:
        # Only tenants with a demo_source: any other tenant's data/raw/<name>.xlsx is the user's own input file.
        tenant="|".join(DEMO_TENANTS) or "(?!)",
    input:
        source=lambda wc: TENANTS[wc.tenant]["demo_source"],
    output:
        "data/raw/{tenant}.xlsx",
    params:
        config=RESOLVED_CONFIG,
        columns=lambda wc: TENANTS[wc.tenant]["columns"],
    log:
        "logs/{tenant}/build_excel.log",
    benchmark:
        "benchmarks/{tenant}/build_excel.tsv"
    resources:
        mem_mb=1000,
        runtime=5,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite build-excel --config {params.config} --tenant {wildcards.tenant} --out {output} 2> {log}")


rule ingest:
    input:
        excel=raw_excel,
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
    output:
        queries=T("queries"),
        stats=T("stats_ingest"),
    params:
        config=RESOLVED_CONFIG,
        tenant=tenant_cfg,
    log:
        "logs/{tenant}/ingest.log",
    benchmark:
        "benchmarks/{tenant}/ingest.tsv"
    resources:
        mem_mb=2000,
        runtime=10,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite ingest --config {params.config} --tenant {wildcards.tenant}"
               " --out {output.queries} --stats {output.stats} 2> {log}")


rule teacher:
    input:
        queries=T("queries"),
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
    output:
        teacher=T("teacher"),
        stats=T("stats_teacher"),
    params:
        config=RESOLVED_CONFIG,
        teacher=config["teacher"],
        system_prompt=lambda wc: TENANTS[wc.tenant]["system_prompt"],
    log:
        "logs/{tenant}/teacher.log",
    benchmark:
        "benchmarks/{tenant}/teacher.tsv"
    resources:
        mem_mb=2000,
        runtime=120,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite teacher --config {params.config} --tenant {wildcards.tenant}"
               " --queries {input.queries} --out {output.teacher} --stats {output.stats} 2> {log}")


rule validate:
    input:
        queries=T("queries"),
        teacher=T("teacher"),
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
    output:
        validated=T("validated"),
        stats=T("stats_validate"),
    params:
        config=RESOLVED_CONFIG,
        rag=config["rag"],
    log:
        "logs/{tenant}/validate.log",
    benchmark:
        "benchmarks/{tenant}/validate.tsv"
    resources:
        mem_mb=2000,
        runtime=60,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite validate --config {params.config} --tenant {wildcards.tenant} --queries {input.queries}"
               " --teacher {input.teacher} --out {output.validated} --stats {output.stats} 2> {log}")


rule split:
    input:
        queries=T("queries"),
        teacher=T("teacher"),
        validated=T("validated"),
        gold_set=optional("gold_set"),
    output:
        train=T("train"),
        val=T("val"),
        test=T("test"),
        stats=T("stats_split"),
    params:
        config=RESOLVED_CONFIG,
        thresholds=lambda wc: TENANTS[wc.tenant]["thresholds"],
        split=config["split"],
        out_dir=lambda wc: tenant_paths(wc.tenant)["sft_dir"],
    log:
        "logs/{tenant}/split.log",
    benchmark:
        "benchmarks/{tenant}/split.tsv"
    resources:
        mem_mb=1000,
        runtime=10,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite split --config {params.config} --tenant {wildcards.tenant} --queries {input.queries}"
               " --teacher {input.teacher} --validated {input.validated} --out-dir {params.out_dir}"
               " --stats {output.stats} 2> {log}")


rule summarize:
    input:
        stats=[T(f"stats_{s}") for s in STAGES],
    output:
        T("summary"),
    log:
        "logs/{tenant}/summarize.log",
    benchmark:
        "benchmarks/{tenant}/summarize.tsv"
    resources:
        mem_mb=500,
        runtime=5,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite summarize --tenant {wildcards.tenant} --stats {input.stats} --out {output} 2> {log}")


rule data_card:
    """The dataset's card: sources and hashes, the funnel with drops per reason, language, difficulty mix,
    gold and red-team sets, known biases, intended use (results/T/data_card.md + .json)."""
    input:
        raw_excel=raw_excel,
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
        gold_set=optional("gold_set"),
        red_team=optional("red_team"),
        queries=T("queries"),
        teacher=T("teacher"),
        validated=T("validated"),
        train=T("train"),
        val=T("val"),
        test=T("test"),
        summary=T("summary"),
    output:
        md=T("data_card"),
        json=T("data_card_json"),
    log:
        "logs/{tenant}/data_card.log",
    benchmark:
        "benchmarks/{tenant}/data_card.tsv"
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        config=RESOLVED_CONFIG,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite data-card --config {params.config} --tenant {wildcards.tenant} --queries {input.queries}"
               " --teacher {input.teacher} --validated {input.validated} --train {input.train} --val {input.val}"
               " --test {input.test} --summary {input.summary} --out {output.md} --out-json {output.json} 2> {log}")
