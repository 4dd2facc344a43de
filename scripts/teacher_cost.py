"""What the demo's teacher stage costs at list prices, synchronous vs `teacher.mode: batch` (docs/services.md).

Runs the real teacher stage (build-excel, ingest, teacher) of every demo tenant with the shipped teacher settings
(gpt-5, reasoning_effort minimal) against tests/fake_openai_server.py (a TEST FAKE that enforces the API's rules),
once per mode with its own cache, and prices the token counts the server reported with teacher.prices.

The prompts are the real ones. The server's token counts are exact o200k_base counts (GPT-5's tokenizer) with
--server-python pointing at a Python that has the `bpe_openai` package (`--tokenizer o200k_base`), else the fake's
estimate. Its reply is "改写：" + the question (about a real rewrite's length), and at reasoning_effort minimal it
reports 0 reasoning tokens: what GPT-5 spends there is not measured by this script.

    .venv/bin/python -m scripts.teacher_cost --server-python /path/to/python-with-bpe_openai
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.servers import FAKE_OPENAI_SERVER, free_port, start_server, stop  # the tests' loopback servers

REPO = Path(__file__).resolve().parents[1]


def run_mode(root: Path, url: str, mode: str) -> dict:
    cfg = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))
    cfg["teacher"].update(provider="openai", mode=mode, cache_dir=f"cache/teacher-{mode}", batch={"poll_s": 0.2})
    cfg["teacher"]["openai"].update(base_url=url, api_key_env="QR_COST_KEY")
    (root / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    env = {**os.environ, "QR_COST_KEY": "sk-test-not-a-real-key", "PYTHONPATH": str(REPO)}
    out = {"rows": 0, "prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost_usd": 0.0}
    for t in cfg["tenants"]:
        base = ["--config", "config.yaml", "--tenant", t["name"]]
        res = f"results/{t['name']}"
        for argv in (["build-excel", *base], ["ingest", *base, "--out", f"{res}/queries.jsonl", "--stats", f"{res}/i.json"],
                     ["teacher", *base, "--queries", f"{res}/queries.jsonl", "--out", f"{res}/teacher-{mode}.jsonl",
                      "--stats", f"{res}/t-{mode}.json", "--no-progress"]):
            subprocess.run([sys.executable, "-m", "qrewrite", *argv], cwd=root, env=env, check=True,
                           capture_output=True)
        for line in (root / res / f"teacher-{mode}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            assert row["status"] == "ok", row
            out["rows"] += 1
            for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
                out[k] += row["usage"][k]
            out["cost_usd"] += row["cost_usd"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-python", default=sys.executable,
                    help="Python that runs the test server (with bpe_openai for exact o200k_base counts)")
    ap.add_argument("--tokenizer", default="o200k_base", help="'' = the server's estimate")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = tmp / "proj"
        for d in ("data/kb", "data/demo"):
            shutil.copytree(REPO / d, root / d)
        shutil.copy(REPO / "config.yaml", root / "config.yaml")
        (tmp / "state").mkdir()
        port = free_port()
        cmd = [args.server_python, str(FAKE_OPENAI_SERVER), "--port", str(port), "--state",
               str(tmp / "state")] + (["--tokenizer", args.tokenizer] if args.tokenizer else [])
        server = start_server(cmd, f"http://127.0.0.1:{port}/health", tmp, tmp / "server.log")
        try:
            result = {mode: run_mode(root, f"http://127.0.0.1:{port}/v1", mode) for mode in ("sync", "batch")}
        finally:
            stop(server)
    result["tokenizer"] = args.tokenizer or "estimate"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
