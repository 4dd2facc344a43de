#!/bin/sh
# `qrewrite` inside the images: runs the code of the checkout the job runs in (Snakemake binds it into the
# Apptainer container and starts the job there; scripts/containers.py run mounts it with podman). The image
# holds the pinned environment, git records the code: lineage.json names both.
repo=${QREWRITE_REPO:-$PWD}
if [ ! -f "$repo/qrewrite/__init__.py" ]; then
    echo "qrewrite: no qrewrite checkout at $repo (the image holds the environment, not the code): run from" \
         "the repo root with the repo mounted, or set QREWRITE_REPO" >&2
    exit 2
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec python -m qrewrite "$@"
