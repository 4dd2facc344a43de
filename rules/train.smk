# Training half: base model → LoRA SFT (ms-swift) → merged SFT model → RL prompts → RL (verl on the
# cluster, ms-swift GRPO on CPU) → merged RL model. TensorBoard under logs/tensorboard/{tenant}/.
# GPU rules run in the swift / verl containers; `qrewrite` re-runs itself in .venvs/<env> locally.

# verl on several nodes: Ray must span the job's nodes, so slurm/ray_on_slurm.sh (on the host, outside
# Snakemake's container) starts Ray in the verl image on every node and runs `qrewrite rl` on the head.
VERL_MULTINODE = config["rl"]["backend"] == "verl" and config["rl"]["verl"]["nnodes"] > 1
RL_ENV = "verl" if config["rl"]["backend"] == "verl" else "swift"
RL_CONTAINER = None if VERL_MULTINODE else CONTAINERS[RL_ENV]
RL_CONDA = None if VERL_MULTINODE else CONDA_ENVS[RL_ENV]
RL_LAUNCH = f"{workflow.basedir}/slurm/ray_on_slurm.sh --image {CONTAINERS['verl']} -- " if VERL_MULTINODE else ""


rule base_model:
    output:
        directory(BASE_MODEL),
    params:
        config=RESOLVED_CONFIG,
        base=config["base_model"],
    log:
        "logs/base_model.log",
    benchmark:
        "benchmarks/base_model.tsv"
    resources:
        mem_mb=8000,
        runtime=30,
    container:
        CONTAINERS["swift"]
    conda:
        CONDA_ENVS["swift"]
    shell:
        logged("qrewrite base-model --config {params.config} --out {output} > {log} 2>&1")


rule sft:
    input:
        base=BASE_MODEL,
        train=T("train"),
        val=T("val"),
        data_card=T("data_card_json"),
    output:
        adapter=directory(T("sft_model")),
        tb=directory(T("tb_sft")),
        stats=T("stats_sft"),
    params:
        config=RESOLVED_CONFIG,
        hp=config["train"],
        model=config["base_model"],
        run_dir=P("sft_run"),
    log:
        "logs/{tenant}/sft.log",
    benchmark:
        "benchmarks/{tenant}/sft.tsv"
    threads: config["train"]["threads"]
    resources:
        mem_mb=16000,
        runtime=240,
    container:
        CONTAINERS["swift"]
    conda:
        CONDA_ENVS["swift"]
    shell:
        logged("qrewrite sft --config {params.config} --tenant {wildcards.tenant} --base {input.base}"
               " --train {input.train} --val {input.val} --data-card {input.data_card} --out {output.adapter}"
               " --run-dir {params.run_dir} --tb {output.tb} --stats {output.stats} --threads {threads} > {log} 2>&1")


rule merge_sft:
    input:
        base=BASE_MODEL,
        adapter=T("sft_model"),
    output:
        directory(T("sft_merged")),
    params:
        config=RESOLVED_CONFIG,
    log:
        "logs/{tenant}/merge_sft.log",
    benchmark:
        "benchmarks/{tenant}/merge_sft.tsv"
    threads: config["train"]["threads"]
    resources:
        mem_mb=16000,
        runtime=60,
    container:
        CONTAINERS["swift"]
    conda:
        CONDA_ENVS["swift"]
    shell:
        logged("qrewrite merge-sft --config {params.config} --tenant {wildcards.tenant} --base {input.base}"
               " --adapter {input.adapter} --out {output} > {log} 2>&1")


rule rl_data:
    input:
        train=T("train"),
        val=T("val"),
        queries=T("queries"),
        red_team=optional("red_team"),
    output:
        train=T("rl_train"),
        val=T("rl_val"),
        train_swift=T("rl_train_swift"),
        val_swift=T("rl_val_swift"),
    params:
        config=RESOLVED_CONFIG,
        val_share=config["rl"]["val_share"],
        red_team_share=config["rl"]["red_team_share"],
        out_dir=P("rl_dir"),
    log:
        "logs/{tenant}/rl_data.log",
    benchmark:
        "benchmarks/{tenant}/rl_data.tsv"
    resources:
        mem_mb=2000,
        runtime=10,
    container:
        CONTAINERS["cpu"]
    conda:
        CONDA_ENVS["cpu"]
    shell:
        logged("qrewrite rl-data --config {params.config} --tenant {wildcards.tenant} --train {input.train}"
               " --val {input.val} --queries {input.queries} --out-dir {params.out_dir} 2> {log}")


rule rl:
    input:
        model=T("sft_merged"),
        train=T("rl_train"),
        val=T("rl_val"),
        train_swift=T("rl_train_swift"),
        kb=lambda wc: TENANTS[wc.tenant]["kb"]["path"],
    output:
        model=directory(T("rl_model")),
        tb=directory(T("tb_rl")),
        stats=T("stats_rl"),
    params:
        config=RESOLVED_CONFIG,
        rl=config["rl"],
        reward=config["reward"],
        rag=config["rag"],
        data_dir=P("rl_dir"),
        run_dir=P("rl_run"),
    log:
        "logs/{tenant}/rl.log",
    benchmark:
        "benchmarks/{tenant}/rl.tsv"
    threads: config["train"]["threads"]
    resources:
        mem_mb=32000,
        runtime=720,
    container:
        RL_CONTAINER
    conda:
        RL_CONDA
    shell:
        logged("qrewrite rl --config {params.config} --tenant {wildcards.tenant} --model {input.model}"
               " --data-dir {params.data_dir} --out {output.model} --run-dir {params.run_dir} --tb {output.tb}"
               " --stats {output.stats} --threads {threads} > {log} 2>&1", launch=RL_LAUNCH)
