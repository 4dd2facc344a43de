"""The verl GPU check and the GPU learning run (docs/gpu-check.md): what `make gpu-kit` stages and
`scripts/gpu_verl_check.sh` / `scripts/gpu_rl_learn.sh` run on a lent GPU machine that has no network.
wheel_stage: wheels and files cut into chunks a device call can carry, put back together and installed there;
kit, slim, learn_kit: the staged set (the check's wheels and payload, the learning run's student and data);
tiny_model: the check's stand-in policy; student: the learning run's student rebuilt from the GGUF; run_config: the
run configs; phase: one `qrewrite rl` run under a budget (killed after a checkpoint for the resume check); imports,
collect, learn_collect, learn_eval: the import check, the eval, and what comes back.

Lab logistics, not the product: this package imports qrewrite, nothing in qrewrite/ imports it
(tests/test_stage_table.py). Kept free of imports here: the device's python3 loads it before any wheel is
installed (`python3 -m tools.gpukit.wheel_stage gather`)."""
