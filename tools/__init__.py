"""The lab's tools around the product (qrewrite/): run from the repo root as `python -m tools.<package>.<module>`.
gpukit: the GPU loan's kit (docs/gpu-check.md)."""
