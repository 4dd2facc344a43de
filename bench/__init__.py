"""The maintained benchmarks (bench/README.md): each is run from the repo root as a module, `python -m bench.<name>`,
and has a --quick smoke mode that tests/test_bench_quick.py runs. Dated one-off studies live in studies/, pinned."""
