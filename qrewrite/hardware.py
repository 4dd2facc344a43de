"""What the machine's CPU can do, read once from the OS: the one place that decides whether bf16 is native here.

A CPU with bf16 units (AVX512-BF16 / AMX) multiplies bf16 faster than float32; one without emulates it, slower than
float32 (several times slower for generation: docs/benchmarks.md). The eval's weights dtype and SFT's mixed
precision both follow it where their config says `auto`.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (Linux: /proc/cpuinfo's flags); elsewhere assumed not."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16(device: str, has_bf16: bool | None = None) -> bool:
    """bf16 runs natively on this device: always on cuda, on a CPU with bf16 units (`has_bf16`, else read here)."""
    return str(device).startswith("cuda") or (cpu_has_bf16() if has_bf16 is None else has_bf16)


def resolve_dtype(setting: str | None, device: str, has_bf16: bool | None = None) -> str:
    """A dtype setting as it runs here, the one rule for the eval's weights (eval.generation.dtype, loaded alike by
    the in-process eval and the deploy check's server) and SFT's arithmetic (train.sft.precision): null is bfloat16
    on cuda and float32 on a CPU (the rule before either setting existed), auto is bfloat16 where it is native
    (`native_bf16`) and float32 on a CPU without bf16 units, which would only emulate it (slower than float32), anything
    else is itself."""
    if setting == "auto":
        return "bfloat16" if native_bf16(device, has_bf16) else "float32"
    return setting or ("bfloat16" if str(device).startswith("cuda") else "float32")


def speed_note(cfg: dict, has_bf16: bool | None = None) -> str | None:
    """What a run on this CPU should expect, said before it starts (rules/common.smk prints it), or None where
    there is nothing to say (cuda; a CPU with bf16 units). A CPU without bf16 units trains and generates in
    float32 under `auto`, and one told `bfloat16` there emulates it: both measured (docs/benchmarks.md)."""
    if native_bf16(str(cfg["train"]["device"]), has_bf16):  # cuda, or a CPU with bf16 units
        return None
    settings = {"train.sft.precision": cfg["train"]["sft"].get("precision"),
                "rl.swift_grpo.precision": cfg["rl"]["swift_grpo"].get("precision"),
                "eval.generation.dtype": cfg["eval"]["generation"].get("dtype")}
    emulated = [k for k, v in settings.items() if v == "bfloat16"]
    if emulated:
        return (f"{', '.join(emulated)} bfloat16 on a CPU without bf16 units (avx512_bf16 / amx_bf16): it is "
                "emulated there, several times slower than float32 (docs/benchmarks.md). Set auto (float32 here, "
                "bfloat16 where the CPU has the units).")
    if "auto" in settings.values():
        return ("this CPU has no bf16 units (avx512_bf16 / amx_bf16), so `auto` trains and generates in float32: "
                "the demo pipeline takes several times as long as on a CPU with them (measured: docs/benchmarks.md).")
    return None


def processes_per_node(device: str, environ=None) -> int:
    """SFT's torchrun processes on this node (ms-swift reads NPROC_PER_NODE): NPROC_PER_NODE where it is set, else
    on cuda one per GPU the job was given (Slurm's SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES), else 1. The Slurm
    profile asks 8 GPUs for sft: without this the job trained on one of them."""
    import os

    env = os.environ if environ is None else environ
    if env.get("NPROC_PER_NODE"):
        return max(1, int(env["NPROC_PER_NODE"]))
    if not str(device).startswith("cuda"):
        return 1
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return max(1, int(env["SLURM_GPUS_ON_NODE"]))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip() and d.strip() != "-1"]
    return max(1, len(visible))
