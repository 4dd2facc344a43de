#!/usr/bin/env bash
# Client-step releases under a tenant's traffic: for each of plain / append / route, the release stage re-run with
# the release held to that candidate (its overlay config), the eval re-scoring it on test, then the gateway under
# 48 requests at concurrency 1, 16 and 32 (bench/serve_engine.py, no baseline), served texts against the eval's.
# Run from the root of a finished `make run` checkout (fivedoctors' SFT and RL students on disk); writes
# serve_{plain,append,route}.json here. Overwrites models/fivedoctors/release: run it in a scratch copy.
set -euo pipefail
here=studies/2026-12-07-client-step-load
for v in plain append route; do
  .venv/bin/snakemake --cores 2 --configfile "$here/$v.yaml" --config only=fivedoctors \
    --allowed-rules release eval_generate eval_rewrites eval all --forcerun release
  .venvs/swift/bin/python -m bench.serve_engine --tenant fivedoctors --levels 1 16 32 --n 48 --out "$here/serve_$v.json"
done
