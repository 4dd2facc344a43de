"""`qrewrite serve` (the rewrite gateway, `make serve`) and `qrewrite serve-plan` (its production commands)."""

from __future__ import annotations

import logging
import sys

from ..cli_args import common
from ..errors import QrewriteError

log = logging.getLogger("qrewrite.serve")


def served_tenants(cfg: dict, names: list[str] | None) -> list[dict]:
    """The tenants to serve: --tenant, else serve.tenants, else every tenant of the config."""
    from ..config import tenant_config

    names = names or cfg["serve"]["tenants"] or [t["name"] for t in cfg["tenants"]]
    return [tenant_config(cfg, n) for n in dict.fromkeys(names)]


def _needs_model_env(cfg: dict, folders: dict[str, str]) -> bool:
    """A released model served in process needs transformers (the swift env); a rule or a remote backend not."""
    from ..runtime.release_file import load_release

    if cfg["serve"]["backend"] != "inprocess":
        return False
    return any(load_release(f)["released"]["kind"] == "model" for f in folders.values())


def apply_overrides(cfg: dict, args) -> dict:
    s = cfg["serve"]
    for key in ("host", "port", "threads", "backend", "timeout_s"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if getattr(args, "openai_base_url", None):
        s["openai"]["base_url"] = args.openai_base_url
    for pair in getattr(args, "openai_base_url_for", None) or ():
        tenant, sep, url = pair.partition("=")
        if not sep or not url:
            raise QrewriteError(f"--openai-base-url-for {pair!r}: expected TENANT=URL")
        s["openai"]["base_urls"][tenant] = url
    if getattr(args, "openai_api_key_env", None):
        s["openai"]["api_key_env"] = args.openai_api_key_env
    if getattr(args, "openai_runtime_lora", False):
        s["openai"]["runtime_lora"] = True
    if getattr(args, "access_log", None) is not None:
        s["access_log"] = args.access_log
    return cfg


def release_folders(tenants: list[dict], pairs: list[str] | None) -> dict[str, str]:
    """tenant → the release folder served: models/T/release, or a --release TENANT=FOLDER (a kept earlier release,
    to roll back to; the deploy check's)."""
    from ..paths import artifact_paths

    out = {t["name"]: artifact_paths(t)["release"] for t in tenants}
    for pair in pairs or ():
        tenant, sep, folder = pair.partition("=")
        if not sep or tenant not in out:
            raise QrewriteError(f"--release {pair!r}: expected TENANT=FOLDER for a served tenant ({', '.join(out)})")
        out[tenant] = folder
    return out


def build(cfg: dict, tenants: list[dict], folders: dict[str, str]):
    """(app, registry): every tenant's release loaded, keys read. Raises QrewriteError naming what is missing."""
    from .app import AccessLog, create_app
    from .keys import Keys
    from .registry import Registry
    from ..runtime.release import load_served

    scfg = cfg["serve"]
    keys = Keys(scfg["api_key_env"], [t["name"] for t in tenants])
    by_name = {t["name"]: t for t in tenants}
    registry = Registry(by_name, folders, lambda n: load_served(cfg, by_name[n], folders[n]),
                        poll_s=scfg["reload_poll_s"], grace_s=max(scfg["drain_s"], scfg["timeout_s"]),
                        warm_up_s=max(scfg["timeout_s"], 120.0))
    registry.load_all()
    return create_app(cfg, registry, keys, AccessLog(scfg["access_log"])), registry


def cmd_serve(args) -> None:
    from ..config import load_config
    from ..envs import ensure_env
    from .keys import key_env

    cfg = apply_overrides(load_config(args.config), args)
    tenants = served_tenants(cfg, args.tenant)
    folders = release_folders(tenants, args.release)
    if _needs_model_env(cfg, folders):
        ensure_env("swift", args.argv)  # transformers and torch, for the released models loaded here
    if cfg["serve"]["backend"] == "inprocess" and cfg["serve"]["threads"]:
        try:
            import torch

            torch.set_num_threads(int(cfg["serve"]["threads"]))
        except ImportError:  # only rules are served: no model, no torch
            pass
    import uvicorn

    app, registry = build(cfg, tenants, folders)
    s = cfg["serve"]
    url = f"http://{s['host']}:{s['port']}"
    print(f"qrewrite serve: {url} (POST /v1/chat/completions, POST /v1/rewrite; access log {s['access_log']})",
          file=sys.stderr)
    for t in tenants:
        r = registry.get(t["name"])
        print(f"  {t['name']}: {r.release_id} ({r.info.get('backend') or 'rule, no model'}); model "
              f"{s['model_name'].format(tenant=t['name'])}, key from ${key_env(s['api_key_env'], t['name'])}",
              file=sys.stderr)
    uvicorn.run(app, host=s["host"], port=s["port"], log_level="warning", access_log=False,
                timeout_graceful_shutdown=max(1, int(s["drain_s"])))


def cmd_serve_plan(args) -> None:
    from ..config import load_config
    from .plan import write_plan

    cfg = load_config(args.config)
    tenants = served_tenants(cfg, args.tenant)
    out = write_plan(cfg, tenants, args.out_dir)
    print(f"qrewrite serve-plan: {out['files']['plan']} ({len(out['vllm'])} vLLM server(s) for "
          f"{sum(len(v['tenants']) for v in out['vllm'])} model release(s), {len(out['rule_tenants'])} rule "
          f"release(s)); scripts in {args.out_dir}", file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("serve", help="the rewrite gateway: each tenant's release served as the eval scored it "
                       "(OpenAI-compatible /v1/chat/completions and /v1/rewrite, a key per tenant, hot swap on a "
                       "new release; docs/deploy.md)")
    common(p, tenant=False)
    p.add_argument("--tenant", action="append", help="serve this tenant (repeat for several; default serve.tenants, "
                   "else every tenant)")
    p.add_argument("--release", action="append", metavar="TENANT=FOLDER", help="serve this release folder for "
                   "the tenant instead of models/TENANT/release (a kept earlier release: a roll-back)")
    p.add_argument("--host", help="bind address (default serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default serve.port, 8400)")
    p.add_argument("--threads", type=int, help="CPU threads of the in-process models (default serve.threads)")
    p.add_argument("--backend", choices=["inprocess", "openai"], help="default serve.backend")
    p.add_argument("--timeout-s", type=float, help="seconds a request waits for its model (default serve.timeout_s)")
    p.add_argument("--openai-base-url", help="the model server's /v1 URL for --backend openai (serve.openai.base_url)")
    p.add_argument("--openai-base-url-for", action="append", metavar="TENANT=URL",
                   help="one tenant's model server (serve.openai.base_urls; repeat)")
    p.add_argument("--openai-api-key-env", help="env var with the model server's key (serve.openai.api_key_env)")
    p.add_argument("--openai-runtime-lora", action="store_true", help="load each SFT release's LoRA adapter into "
                   "the model server when it goes live (serve.openai.runtime_lora)")
    p.add_argument("--access-log", help="default serve.access_log ('' for none)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("serve-plan", help="the production commands: vLLM (one base with a LoRA adapter per tenant "
                       "where releases share it), the gateway, a Slurm batch script with Apptainer (docs/deploy.md)")
    common(p, tenant=False)
    p.add_argument("--tenant", action="append", help="plan for this tenant (default serve.tenants, else every one)")
    p.add_argument("--out-dir", default="reports/serve", help="where plan.json and the scripts go (default %(default)s)")
    p.set_defaults(func=cmd_serve_plan)
