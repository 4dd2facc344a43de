# Every rule is one row of the stage table, qrewrite/workflow/stages.py: its inputs, outputs, params, env and
# resources are read from there (dvc.yaml is generated from the same table), and it runs the `qrewrite`
# subcommand of its name, whose handler is cmd_<name> in qrewrite/<package>/cli.py; `snakemake --list-rules`
# prints each with what it makes and where its code is. The helpers are in rules/common.smk.

for _s in STAGES.values():
    if not jobs(_s, config):
        continue  # e.g. no eval_generate when no eval candidate is a local model

    rule:
        name: _s.name
        input: unpack(inputs(_s))
        output: **outputs(_s)
        params: **params(_s)
        log: **logs(_s)
        benchmark: f"benchmarks/{where(_s)}{_s.name}.tsv"
        threads: TRAIN_THREADS if _s.threads else 1
        priority: _s.priority
        resources: mem_mb=_s.mem_mb, runtime=_s.runtime
        wildcard_constraints: **constraints(_s)
        container: container(_s)
        conda: conda(_s)
        shell: STAGE_SHELL

    workflow.get_rule(_s.name).docstring = f"{_s.doc} Code: qrewrite/{_s.package}/cli.py cmd_{_s.name}."
