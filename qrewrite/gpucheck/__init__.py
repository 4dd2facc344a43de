"""The verl GPU check (docs/gpu-check.md): what `make gpu-kit` stages here and `scripts/gpu_verl_check.sh` runs on a
lent GPU machine that has no network. kit: the staged set; tiny_model: the stand-in policy; run_config: the run
configs; phase: one `qrewrite rl` run under a budget (killed after a checkpoint for the resume check); collect:
what comes back."""
