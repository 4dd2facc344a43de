"""The GPU check's import check: the whole chain imports, at the versions the kit carries, before any run starts
(a broken import then costs seconds, not a run's start-up). Writes env.json: versions, the GPU, flash-attn and
the attention the runs get, and whether verl took the project's critic loader (qrewrite.training.rl.verl.critic)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
import time

from qrewrite.io_utils import write_json

CHAIN = ("torch", "transformers", "tokenizers", "peft", "ray", "verl", "vllm", "trl", "tensordict", "transfer_queue",
         "jieba", "bm25s", "vllm.v1.engine.core", "vllm.entrypoints.openai.api_server", "verl.trainer.main_ppo",
         "verl.workers.rollout.vllm_rollout.vllm_async_server")
DISTS = ("torch", "transformers", "tokenizers", "peft", "ray", "verl", "vllm", "trl", "numpy", "pydantic",
         "accelerate", "datasets", "tensordict", "xgrammar", "flash-attn")


def check(*, gpu: bool) -> dict:
    t0 = time.monotonic()
    env: dict = {"python": platform.python_version(), "executable": sys.executable, "versions": {}, "imports": {},
                 "gcc": shutil.which("gcc")}
    for d in DISTS:
        try:
            env["versions"][d] = md.version(d)
        except md.PackageNotFoundError:
            env["versions"][d] = None
    failed = []
    for mod in CHAIN:
        t = time.monotonic()
        try:
            importlib.import_module(mod)
            env["imports"][mod] = round(time.monotonic() - t, 2)
        except Exception as e:  # every failure listed, then the check fails
            env["imports"][mod] = f"{type(e).__name__}: {e}"[:300]
            failed.append(mod)
    import torch

    env["cuda"] = torch.cuda.is_available()
    env["device"] = torch.cuda.get_device_name(0) if env["cuda"] else None
    from qrewrite.training.rl.verl.overrides import CRITIC_LIB
    from qrewrite.training.rl.verl.train import verl_attention, verl_env

    env["attention"] = verl_attention()
    # what a Ray worker gets: `import verl` with the environment `qrewrite rl` gives verl
    hook = {"VERL_USE_EXTERNAL_MODULES": verl_env({"rl": {"verl": {}}}, config_path="config.yaml",
                                                  tb_dir="/tmp")["VERL_USE_EXTERNAL_MODULES"]}
    proc = subprocess.run([sys.executable, "-c", "import verl, verl.utils.model as m; "
                           "print(m.load_valuehead_model.__module__)"], env={**os.environ, **hook},
                          capture_output=True, text=True)
    env["critic_loader"] = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else proc.stderr[-300:]
    if env["critic_loader"] != CRITIC_LIB:  # the module the hook names defines the loader verl then calls
        failed.append("critic loader hook")
    env["import_s"] = round(time.monotonic() - t0, 1)
    env["failed"] = failed
    if gpu and not env["cuda"]:
        failed.append("torch.cuda")
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.imports", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="env.json to write")
    ap.add_argument("--cpu", action="store_true", help="rehearsal: no GPU required")
    args = ap.parse_args(argv)
    env = check(gpu=not args.cpu)
    write_json(args.out, env)
    print("versions:", {k: v for k, v in env["versions"].items() if v})
    print(f"cuda {env['cuda']} {env['device'] or ''}; attention {env['attention']}; the critic's loader in a verl "
          f"worker: {env['critic_loader']}; imports {env['import_s']} s")
    if env["failed"]:
        for m in env["failed"]:
            print(f"IMPORT FAILED {m}: {env['imports'].get(m)}", file=sys.stderr)
        return 1
    print("IMPORT CHECK OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
