"""The production serving plan (`qrewrite serve-plan`): which model server serves which tenant's release, and the
command lines that start them and the gateway, on a GPU node under Slurm with Apptainer.

One base, an adapter per tenant (vLLM's multi-LoRA serving): every release that is its SFT student is that tenant's
LoRA adapter (models/T/sft, the sft stage's best checkpoint) on the same base model, so one vLLM server holds the
base once and each tenant's adapter by name. The gateway loads each release's adapter into it when the release goes
live (`--openai-runtime-lora`, vLLM's runtime LoRA loading), under a name carrying the release id, and a hot swap
loads the new adapter beside the old (`--max-loras` is twice the tenants): an answer's release id names the weights
that made it. Servers that share the job's GPU split deploy.production.gpu_memory_utilization between them. A release that is
its RL student is a merged model (RL trains LoRA on the merged SFT model, so it is no adapter of the base): it gets
a vLLM server of its own. A rule release needs no server: the gateway answers it.

The gateway then runs with `serve.backend: openai`, each tenant's base_url and model name from the plan
(`serve.openai.base_urls`), and applies each release's client step (route_by_retrieval, append_history) as it
does in process. Keys come from the environment of the job (the sbatch script names the variables, never values).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import write_json, write_text_atomic
from ..paths import BASE_MODEL, artifact_paths
from ..runtime.release_file import load_release
from .keys import key_env


def _adapter(tenant: dict) -> dict | None:
    """The SFT LoRA adapter behind a release of the SFT student: {path, rank, base} (None when it is missing)."""
    path = Path(artifact_paths(tenant)["sft_model"])
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        return None
    conf = json.loads(cfg_file.read_text(encoding="utf-8"))
    return {"path": str(path), "rank": int(conf.get("r") or 16), "base": conf.get("base_model_name_or_path")}


def plan(cfg: dict, tenants: list[dict]) -> dict:
    """The plan as data: per tenant what serves it; the vLLM servers; the gateway's settings."""
    prod = cfg["deploy"]["production"]
    port = prod["port"]
    per_tenant, lora, merged, rules = {}, [], [], []
    for t in tenants:
        folder = artifact_paths(t)["release"]
        released = load_release(folder)["released"]
        name = cfg["serve"]["model_name"].format(tenant=t["name"])
        if released["kind"] == "rule":
            rules.append(t["name"])
            per_tenant[t["name"]] = {"release": released["name"], "served_by": "gateway (rule, no model)"}
            continue
        adapter = _adapter(t) if released.get("artifact") == "sft_merged" else None
        if adapter is not None:
            lora.append({"tenant": t["name"], "name": name, **adapter})
        else:
            merged.append({"tenant": t["name"], "name": name, "path": folder})
        per_tenant[t["name"]] = {"release": released["name"], "decoding_client_step":
                                 next((k for k in ("route_by_retrieval", "append_history")
                                       if (released.get("decoding") or {}).get(k)), None)}
    servers = []
    # every server shares the job's one GPU: each gets its share of deploy.production.gpu_memory_utilization
    n_servers = (1 if lora else 0) + len(merged)
    share = int(prod["gpu_memory_utilization"] / max(1, n_servers) * 100) / 100
    common = ["--host", prod["host"], "--dtype", "bfloat16", "--max-model-len", str(prod["max_model_len"]),
              "--gpu-memory-utilization", str(share)]
    if lora:
        bases = {a["base"] for a in lora}
        if len(bases) > 1:
            raise QrewriteError(f"the SFT adapters name different bases ({sorted(map(str, bases))}): one vLLM base "
                                "cannot hold them", hint="train every tenant on one base_model, or serve them apart")
        argv = ["vllm", "serve", BASE_MODEL, "--port", str(port), "--served-model-name", "qrewrite-base",
                "--enable-lora", "--max-loras", str(2 * len(lora)), "--max-lora-rank", str(max(a["rank"] for a in lora)),
                "--lora-modules", *[f"{a['name']}={a['path']}" for a in lora], *common]
        servers.append({"kind": "multi-lora", "base": BASE_MODEL, "port": port,
                        "tenants": [a["tenant"] for a in lora], "adapters": lora, "argv": argv})
        port += 1
    for m in merged:
        argv = ["vllm", "serve", m["path"], "--port", str(port), "--served-model-name", m["name"], *common]
        servers.append({"kind": "merged", "port": port, "tenants": [m["tenant"]], "argv": argv})
        port += 1
    base_urls = {t: f"http://{{MODEL_HOST}}:{s['port']}/v1" for s in servers for t in s["tenants"]}
    for t, url in base_urls.items():
        per_tenant[t]["served_by"] = url
    return {"tenants": per_tenant, "vllm": servers, "rule_tenants": rules, "base_urls": base_urls,
            "gpu_memory_utilization_each": share if servers else None,
            "key_env": {t["name"]: key_env(cfg["serve"]["api_key_env"], t["name"]) for t in tenants},
            "backend_key_env": prod["api_key_env"]}


def _script(cfg: dict, p: dict, tenants: list[dict], config_path: str) -> str:
    """A Slurm batch script: the vLLM servers in the verl image on the GPU, then the gateway in the cpu image."""
    images = cfg["containers"]
    key = p["backend_key_env"]
    lines = ["#!/bin/bash", "#SBATCH --job-name=qrewrite-serve", "#SBATCH --gpus=1", "#SBATCH --cpus-per-task=8",
             "#SBATCH --mem=64G", "#SBATCH --time=7-00:00:00",
             "# Generated by `qrewrite serve-plan` (docs/deploy.md). Submit from the project root with the keys in",
             "# the environment (sbatch passes it on; Apptainer passes it into the containers):",
             *[f"#   export {v}=...   # tenant {t}" for t, v in p["key_env"].items()],
             f"#   export {key}=...   # between the gateway and vLLM",
             "set -euo pipefail", 'BIND="$PWD${QREWRITE_APPTAINER_BIND:+,$QREWRITE_APPTAINER_BIND}"',
             "MODEL_HOST=127.0.0.1", "pids=()"]
    for s in p["vllm"]:
        cmd = shlex.join(s["argv"])
        # runtime LoRA updating: the gateway loads each release's adapter when it goes live (serve.openai.runtime_lora)
        lora_env = "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True " if s["kind"] == "multi-lora" else ""
        lines.append(f'{lora_env}VLLM_API_KEY="${key}" apptainer exec --nv --bind "$BIND" --pwd "$PWD" '
                     f"{shlex.quote(images['verl'])} {cmd} &")
        lines.append("pids+=($!)")
    lines.append("for port in " + " ".join(str(s["port"]) for s in p["vllm"]) + "; do  # each server lists its models")
    lines.append('  until curl -sf -H "Authorization: Bearer $' + key + '" "http://$MODEL_HOST:$port/v1/models" '
                 '>/dev/null; do sleep 5; done')
    lines.append("done")
    # vLLM and the gateway share the node: the backends are on loopback
    lines.append(f"apptainer exec --bind \"$BIND\" --pwd \"$PWD\" {shlex.quote(images['cpu'])} "
                 + shlex.join(gateway_argv(cfg, p, tenants, config_path, host="127.0.0.1")))
    lines.append('kill "${pids[@]}" 2>/dev/null || true')
    return "\n".join(lines) + "\n"


def gateway_argv(cfg: dict, p: dict, tenants: list[dict], config_path: str, host: str = "{MODEL_HOST}") -> list[str]:
    """`qrewrite serve` in front of the plan's vLLM servers (`host`: where they run)."""
    argv = ["qrewrite", "serve", "--config", config_path, "--host", "0.0.0.0",
            "--port", str(cfg["serve"]["port"])]
    for t in tenants:
        argv += ["--tenant", t["name"]]
    if p["vllm"]:
        argv += ["--backend", "openai", "--openai-api-key-env", p["backend_key_env"]]
        if any(s["kind"] == "multi-lora" for s in p["vllm"]):
            argv += ["--openai-runtime-lora"]
        for t, url in p["base_urls"].items():
            argv += ["--openai-base-url-for", f"{t}={url.replace('{MODEL_HOST}', host)}"]
    return argv


def write_plan(cfg: dict, tenants: list[dict], out_dir: str, config_path: str = "config.yaml") -> dict:
    p = plan(cfg, tenants)
    out = Path(out_dir)
    files = {"plan": str(out / "plan.json"), "sbatch": str(out / "serve.sbatch")}
    p["gateway"] = {"argv": gateway_argv(cfg, p, tenants, config_path),
                    "backend_key_env": p["backend_key_env"],
                    "note": "the gateway sends the backend's key (serve.openai.api_key_env) to vLLM"}
    p["files"] = files
    write_text_atomic(files["sbatch"], _script(cfg, p, tenants, config_path))
    write_json(files["plan"], p)
    return p
