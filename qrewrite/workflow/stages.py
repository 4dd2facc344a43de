"""The stage table: every pipeline stage once, with what it reads, writes and runs. The single source of truth.

The Snakemake rules (rules/stages.smk), dvc.yaml (`qrewrite dvc-yaml`), the lineage walk (`upstream()`)
and the tests' stage maps are all derived from `STAGES`; nothing else lists the graph. One name per stage:
rule `merge_sft` = DVC stage `merge_sft@T` = `qrewrite merge-sft` = `cmd_merge_sft` in
`qrewrite/training/cli.py` (`Stage.handler`).

A stage's files are artifact keys (`qrewrite.paths`): layout keys (`queries`, `sft_model`, ...), files the
tenant's config gives (`raw_excel`, `kb`, `gold_set`, ...: `CONFIG_FILES`) and a few that follow from the
config (`eval_split`, `candidate_model`, `rewrites`, `all_rewrites`, `deploy_model`,
`deploy_rewrites`).
`resolve()` turns a key into a path for one job. It is also called with placeholder names ("{tenant}",
"${key}", "${item.kb}") to make Snakemake's wildcard patterns and DVC's foreach templates from the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from functools import cache

from ..config import has_student
from ..eval.candidates import MODEL_KINDS, rules_only, tenant_candidates
from ..paths import BASE_MODEL, CONFIG_FILES, REPORT_HTML, deploy_json, eval_paths, tenant_paths
# Keys that depend on an eval candidate (the job's, or deploy.candidate's): per-item values in dvc.yaml.
CANDIDATE_FILES = ("candidate_model", "deploy_model")


@dataclass(frozen=True)
class Arg:
    """One path on the command line: `flag` takes the files of `keys`; `role` says what the stage does with it."""

    flag: str
    keys: tuple[str, ...]
    role: str  # "in" (read), "out" (written), "dir" (a folder holding files listed elsewhere: not tracked itself)

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def i(flag: str, *keys: str) -> Arg:
    """An input: `--flag` path(s) of `keys` (default: the flag's name)."""
    return Arg(f"--{flag}", keys or (flag.replace("-", "_"),), "in")


def o(flag: str, *keys: str) -> Arg:
    """An output."""
    return Arg(f"--{flag}", keys or (flag.replace("-", "_"),), "out")


def d(flag: str, key: str) -> Arg:
    """A working folder: the stage's tracked files in it are listed in `reads`/`writes`, or it is scratch."""
    return Arg(f"--{flag}", (key,), "dir")


@dataclass(frozen=True)
class Stage:
    name: str                       # rule, DVC stage; the command is the name with '-', the handler cmd_<name>
    doc: str                        # what it makes (the rule's docstring)
    package: str                    # qrewrite/<package>/cli.py holds the handler
    args: tuple[Arg, ...] = ()      # the command line after --config/--tenant/--candidate
    reads: tuple[str, ...] = ()     # inputs not on the command line (found through the config, or in a --dir)
    writes: tuple[str, ...] = ()    # outputs not on the command line (written into a --dir)
    params: tuple[str, ...] = ()    # config it reads: "rag", "rl.val_share", "tenant.thresholds", "candidate"
    per: str = "tenant"             # tenant | demo_tenant | candidate | once | all_tenants
    candidates: str | None = None   # per candidate: "model" (local models) or "other" (every other kind)
    env: str = "cpu"                # cpu | swift | verl | rl (rl.backend's env): container and conda env
    mem_mb: int = 2000
    runtime: int = 10               # minutes (Slurm time limit)
    threads: bool = False           # gets train.threads, passed as --threads
    uses_config: bool = True        # takes --config
    metrics: tuple[str, ...] = ()   # outputs DVC shows as metrics (not cached)
    plots: tuple[str, ...] = ()     # outputs DVC shows as plots (not cached)
    report: str | None = None       # Snakemake report category of the outputs (`snakemake --report`)
    launcher: str | None = None     # "ray": on several verl nodes, slurm/ray_on_slurm.sh runs the command
    half: str = "data"              # data | models | eval (`snakemake data`, `models`, all) | deploy (a check)
    dvc: bool = True                # a DVC stage too (the deploy check measures a machine: Snakemake only)
    server_log: bool = False        # also writes the model server's own log next to its log
    priority: int = 0               # Snakemake's job priority: when cores are short, higher runs first
    student: bool = False           # only for tenants that train a student (tenants[].student not `never`)
    switch: str | None = None       # a boolean config key (e.g. "pref.enabled"): no jobs while it is false
    # modules the command hands another program by file path (no import shows them): its code deps too
    by_path: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        return self.name.replace("_", "-")

    @property
    def handler(self) -> tuple[str, str]:
        """(module, function) of the stage's subcommand handler."""
        return f"qrewrite.{self.package}.cli", f"cmd_{self.name}"

    def key_of(self, name: str) -> str:
        """The artifact key behind input/output name `name`: its argument's (first) key, or the key itself."""
        return next((a.keys[0] for a in self.args if a.name == name), name)

    def keys(self, role: str) -> list[str]:
        """Artifact keys the stage reads ("in") or writes ("out"), command line first."""
        extra = self.reads if role == "in" else self.writes
        return [k for a in self.args if a.role == role for k in a.keys] + list(extra)


STAGES: dict[str, Stage] = {s.name: s for s in (
    # --- data half: raw Excel → queries → teacher → validated → SFT splits → summary, data card ------------
    Stage("build_excel", "Demo tenants only: the raw Excel from its reviewable JSONL source (exercises the "
          "Excel reader).", "data", per="demo_tenant", args=(o("out", "raw_excel"),), reads=("demo_source",),
          params=("tenant.columns",), mem_mb=1000, runtime=5),
    Stage("ingest", "Raw Excel → queries.jsonl: stable ids, counted drops.", "data",
          args=(o("out", "queries"), o("stats", "stats_ingest")), reads=("raw_excel", "kb"),
          params=("tenant.columns", "tenant.sheet", "tenant.thresholds.max_query_chars",
                  "tenant.thresholds.max_missing_gold_share", "tenant.language", "tenant.kb")),
    Stage("teacher", "Every query's teacher rewrite (cached calls: a rerun repeats none).", "teacher",
          args=(i("queries"), o("out", "teacher"), o("stats", "stats_teacher")), reads=("kb",),
          params=("teacher", "rag.local", "tenant.system_prompt", "tenant.language", "tenant.kb"), runtime=120),
    Stage("validate", "The teacher's rewrites against the tenant's RAG service: rewrite vs raw query.", "rag",
          args=(i("queries"), i("teacher"), o("out", "validated"), o("stats", "stats_validate")), reads=("kb",),
          params=("rag", "tenant.language", "tenant.kb", "tenant.tenant_id"), runtime=60),
    Stage("split", "Validated rows → SFT train/val/test: filter, dedupe, hold out the gold set, split.", "data",
          args=(i("queries"), i("teacher"), i("validated"), d("out-dir", "sft_dir"), o("stats", "stats_split")),
          reads=("gold_set",), writes=("train", "val", "test"),
          params=("split", "tenant.thresholds", "tenant.system_prompt", "tenant.language"), mem_mb=1000),
    Stage("reward_check", "The judge's AUC and the reward's preference on labels derived from the tenant's own "
          "data (and its hand labels): what RL may train on.", "reward",
          args=(i("queries"), i("teacher"), i("validated"), o("out", "reward_check")), reads=("kb", "judge_labels"),
          params=("reward", "rag", "tenant.language", "tenant.kb", "tenant.tenant_id", "tenant.judge_rubric"),
          runtime=30),
    Stage("summarize", "Per-stage stats → summary.json: rows in and out per stage, drops per reason.", "data",
          args=(i("stats", "stats_ingest", "stats_teacher", "stats_validate", "stats_split"),
                i("reward-check", "reward_check"), o("out", "summary")),
          uses_config=False, metrics=("summary",), mem_mb=500, runtime=5),
    Stage("data_card", "The dataset's card: sources and hashes, funnel, language, difficulty mix, gold and "
          "red-team sets, known biases, intended use.", "data",
          args=(i("queries"), i("teacher"), i("validated"), i("train"), i("val"), i("test"), i("summary"),
                o("out", "data_card"), o("out-json", "data_card_json")),
          reads=("raw_excel", "kb", "gold_set", "red_team"), params=("tenant",), mem_mb=1000, runtime=5),
    # --- training half: base model → LoRA SFT → merged SFT model → RL prompts → RL → merged RL model ---------
    Stage("base_model", "The base model folder: converted from the packaged GGUF, or linked from a local "
          "folder (base_model.source).", "training", per="once", args=(o("out", "base_model"),),
          params=("base_model",), env="swift", mem_mb=8000, runtime=30, half="models", student=True),
    # the gate reads the summary, so the data card and summary are on disk whatever it decides
    Stage("training_gate", "Before SFT: the teacher retrieves at least as well as query + history on the tenant's "
          "rows with gold and enough training rows passed, else stop with the figures and what to set → gate.json.",
          "training", args=(i("summary"), o("out", "gate")),
          # the card its stop message points to is written first: without the edge the gate's few seconds could
          # stop the run before Snakemake started the card
          reads=("data_card",),
          params=("gate", "tenant.student", "teacher"), runtime=5, mem_mb=500, half="models", student=True),
    Stage("sft_targets", "What SFT learns: the teacher's rewrites, or per row whichever of it, it + the history "
          "terms it dropped and it + the history retrieves gold most surely, or it + the history on every row "
          "(train.sft.targets).", "training",
          args=(i("train"), i("val"), i("queries"), o("out-train", "sft_train"), o("out-val", "sft_val"),
                o("stats", "stats_sft_targets")), reads=("kb", "gate"),
          params=("train.sft.targets", "tenant.sft_targets", "rag", "tenant.kb", "tenant.language",
                  "tenant.tenant_id"), mem_mb=1000, runtime=60, half="models", student=True),
    # the data card is an input of SFT so that every model's lineage lists the card of the data it learnt from
    Stage("sft", "LoRA SFT with ms-swift; keeps the best checkpoint by validation loss.", "training",
          args=(i("base", "base_model"), i("train", "sft_train"), i("val", "sft_val"), i("data-card", "data_card_json"),
                o("out", "sft_model"), d("run-dir", "sft_run"), o("tb", "tb_sft"), o("stats", "stats_sft")),
          params=("train", "base_model"), env="swift", threads=True, mem_mb=16000, runtime=240, half="models", student=True),
    Stage("merge_sft", "The LoRA adapter merged into its base model (swift export --merge_lora).", "training",
          args=(i("base", "base_model"), i("adapter", "sft_model"), o("out", "sft_merged")),
          params=("train.device",), env="swift", threads=True, mem_mb=16000, runtime=60, half="models", student=True),
    Stage("rl_data", "SFT splits → RL prompts with the teacher's side (verl parquet + ms-swift jsonl).",
          "training", args=(i("train"), i("val"), i("queries"), d("out-dir", "rl_dir")), reads=("red_team",),
          writes=("rl_train", "rl_val", "rl_train_swift", "rl_val_swift"),
          params=("rl.val_share", "rl.red_team_share", "tenant.system_prompt", "tenant.language"), half="models", student=True),
    Stage("rl", "RL on the merged SFT model with the qrewrite reward (verl on the cluster, ms-swift GRPO on "
          "CPU) → the merged RL model.", "training",
          args=(i("model", "sft_merged"), d("data-dir", "rl_dir"), i("reward-check", "reward_check"),
                o("out", "rl_model"), d("run-dir", "rl_run"), o("tb", "tb_rl"), o("stats", "stats_rl"),
                o("val-rewrites", "rl_val_rewrites")),
          reads=("rl_train", "rl_val", "rl_train_swift", "rl_val_swift", "kb"),
          # the reward plugins: ms-swift's --external_plugins (training.rl.swift_grpo.PLUGIN), verl's reward file
          # (training.rl.verl.train.REWARD_FILE); tests/test_dvc.py holds them to those constants
          by_path=("qrewrite.reward.swift_plugin", "qrewrite.reward.verl_reward"),
          params=("rl", "reward", "rag", "eval.generation", "eval.bootstrap", "tenant.judge_rubric", "tenant.language", "tenant.system_prompt",
                  "tenant.kb", "tenant.tenant_id"),
          # RL heads the longest path left after SFT (RL, then its eval generation): ahead of the SFT model's
          # eval generation, which can wait. Left to the scheduler, both tenants' RL ran last, and make run took
          # longer (docs/notes/2026-11-27-make-run-timing.md).
          env="rl", threads=True, mem_mb=32000, runtime=720, launcher="ray", half="models", priority=10, student=True),
    # preference optimisation (pref.enabled): training rows only; the model is a release candidate like sft and rl
    Stage("pref_pairs", "Preference pairs from the training rows: the SFT student's sampled rewrites and the "
          "teacher's, scored by Hit@1 against gold through the RAG → pairs.jsonl (DPO), examples.jsonl (KTO) + "
          "summary.json.", "training",
          args=(i("train"), i("queries"), i("model", "sft_merged"), o("out", "pref_pairs"),
                o("examples", "pref_examples"), o("summary", "pref_pairs_summary")),
          reads=("kb",), params=("pref", "eval.generation", "rag", "train.device", "tenant.kb", "tenant.language",
                                 "tenant.system_prompt", "tenant.tenant_id"),
          env="swift", threads=True, mem_mb=16000, runtime=60, half="models", student=True, switch="pref.enabled"),
    Stage("pref", "DPO with an SFT term, or KTO where pairs are few (ms-swift), of a LoRA on the merged SFT model, "
          "merged → the preference model.", "training",
          args=(i("model", "sft_merged"), i("pairs", "pref_pairs"), i("examples", "pref_examples"),
                i("summary", "pref_pairs_summary"),
                o("adapter", "pref_model"), o("out", "pref_merged"), d("run-dir", "pref_run"), o("tb", "tb_pref"),
                o("stats", "stats_pref")),
          params=("pref", "train.device", "base_model"), env="swift", threads=True, mem_mb=16000, runtime=240,
          half="models", student=True, switch="pref.enabled"),
    # the release sees the validation split only (no test, no eval output): tests/test_release.py holds it to that
    Stage("release", "What the tenant gets, chosen on the validation split: query + history, the query alone or the "
          "embedded teacher (rules), SFT, the preference model or RL, each with the decoding levers under "
          "consideration; a later one must win by more than half a row → models/T/release.",
          "release", args=(i("val"), i("queries"), i("sft", "sft_merged"), i("pref", "pref_merged"),
                           i("rl", "rl_model"), i("rl-rewrites", "rl_val_rewrites"), o("out", "release")),
          reads=("kb",), params=("release", "pref.enabled", "teacher.provider", "tenant.teacher", "eval.generation",
                                 "eval.bootstrap", "rag", "tenant.kb",
                                 "tenant.language", "tenant.system_prompt", "tenant.tenant_id"),
          env="swift", threads=True, mem_mb=16000, runtime=60, half="models", priority=5),
    # --- evaluation and report ---------------------------------------------------------------------------
    Stage("eval_generate", "A local model candidate's rewrites (greedy, the SFT prompt) with per-query latency "
          "and GPU-hour cost.", "eval", per="candidate", candidates="model",
          args=(i("test", "eval_split"), i("queries"), i("model", "candidate_model"), o("out", "rewrites")),
          # the KB and rag: a route_by_retrieval decoding (qrewrite.runtime.route) retrieves to choose what is sent
          reads=("gold_set", "red_team", "kb"),
          params=("candidate", "eval.generation", "eval.max_rows", "eval.gpu_hour_usd", "rag", "tenant"),
          env="swift", threads=True, mem_mb=16000, runtime=120, half="eval"),
    # the teacher candidate rewrites gold and red-team rows the data half never saw: it needs the KB
    Stage("eval_rewrites", "The raw query, the recorded teacher rewrites, or an API candidate's rewrites "
          "(cached calls).", "eval", per="candidate", candidates="other",
          args=(i("test", "eval_split"), i("queries"), i("teacher"), o("out", "rewrites")),
          reads=("kb", "gold_set", "red_team"), params=("candidate", "eval.max_rows", "teacher", "tenant"),
          runtime=60, half="eval"),
    Stage("eval", "Every candidate scored: retrieval vs gold, reranker scores, judge, win/tie/loss, latency, "
          "cost, paired intervals.", "eval",
          args=(i("test", "eval_split"), i("queries"), i("teacher"), i("rewrites", "all_rewrites"),
                i("reward-check", "reward_check"), o("out", "eval_json"), o("examples"), o("plots")),
          reads=("kb", "gold_set", "red_team"), params=("eval", "reward", "rag", "tenant"),
          metrics=("eval_json",), plots=("plots",), report="Evaluation", runtime=30, half="eval"),
    Stage("report", "reports/index.html over every tenant: tables, metric bars, training curves, data funnel, "
          "lineage.", "report", per="all_tenants", args=(o("out", "report_html"),),
          reads=("eval_json", "examples", "summary", "data_card", "data_card_json", "tb_sft", "tb_rl", "release"),
          params=("eval",), report="Report", mem_mb=1000, half="eval"),
    # --- the distilled judge (`snakemake judge`, not in `all`; an optional study: Snakemake only, as the deploy check)
    Stage("judge_data", "The distilled judge's items: labelled judgements from the tenant's data and the student's "
          "samples, held out by question; its SFT and GRPO files.", "judge",
          args=(i("queries"), i("validated"), i("test", "eval_split"), i("student", "sft_merged"),
                i("rewrites", "all_rewrites"), o("judgements", "judge_items"), o("sft-train", "judge_sft_train"),
                o("sft-val", "judge_sft_val"), o("grpo-train", "judge_grpo_train"),
                o("student-test", "judge_student_test"), o("stats", "stats_judge_data")),
          # the reward settings the items read (the labelling judge, the key terms shown): not the rest of
          # reward, which only judge-eval and RL read (reward.judge.model.rule_weight must not retrain the judge)
          reads=("kb", "red_team"), params=("judge", "reward.judge.provider", "reward.judge.openai",
                                            "reward.judge.model.key_terms", "rag", "tenant"), env="swift", threads=True,
          mem_mb=8000, runtime=60, half="judge", dvc=False, student=True),
    Stage("judge_sft", "LoRA SFT of the judge on reason + score from the base model, merged.", "judge",
          args=(i("base", "base_model"), i("train", "judge_sft_train"), i("val", "judge_sft_val"),
                o("adapter", "judge_sft_model"), o("out", "judge_sft_merged"), d("run-dir", "judge_sft_run"),
                o("tb", "tb_judge_sft"), o("stats", "stats_judge_sft")),
          params=("judge.sft", "train", "base_model"), env="swift", threads=True, mem_mb=16000, runtime=240,
          half="judge", dvc=False, student=True),
    Stage("judge_grpo", "GRPO of the SFT judge with the format and verdict rewards, merged: the distilled judge.",
          "judge", args=(i("model", "judge_sft_merged"), i("train", "judge_grpo_train"), o("out", "judge_model"),
                         d("run-dir", "judge_grpo_run"), o("tb", "tb_judge_grpo"), o("stats", "stats_judge_grpo")),
          params=("judge.grpo", "rl.swift_grpo", "train.device", "base_model"), env="swift", threads=True,
          mem_mb=16000, runtime=240, half="judge", dvc=False, student=True),
    Stage("judge_eval", "Base vs SFT vs GRPO judge, beside the rule (and API) judge: verdict accuracy, format, AUC "
          "on held-out items, hand labels and the student's own rewrites, cost → judge.json.", "judge",
          args=(i("judgements", "judge_items"), i("student-test", "judge_student_test"), i("base", "base_model"),
                i("sft", "judge_sft_merged"), i("grpo", "judge_model"), o("out", "judge_json")),
          reads=("kb", "judge_labels"), params=("judge", "reward", "reward.judge.model", "reward.judge.openai", "rag",
                                                "eval.bootstrap", "eval.gpu_hour_usd",
                                                "tenant"), env="swift", threads=True, mem_mb=16000, runtime=120,
          metrics=("judge_json",), half="judge", dvc=False, student=True),
    # --- serving check (`snakemake deploy`, not in `all`) ------------------------------------------------
    Stage("deploy_check", "Serve the release through the gateway (qrewrite serve) on loopback, send every test row "
          "as the tenant's RAG would at each concurrency level, compare with the eval's release rows → deploy.json.",
          "deploy",
          args=(i("model", "deploy_model"), i("test", "eval_split"), i("queries"), i("eval-json", "eval_json"),
                i("eval-rewrites", "deploy_rewrites"), o("out", "deploy_json")),
          params=("deploy", "serve", "eval.generation", "eval.max_rows", "rag", "tenant"), env="swift", threads=True,
          mem_mb=16000, runtime=60, half="deploy", dvc=False, server_log=True),
)}

# Artifact keys that are folders (Snakemake `directory()` outputs).
DIRECTORIES = frozenset({"base_model", "sft_model", "sft_merged", "rl_model", "pref_model", "pref_merged", "tb_pref",
                         "release", "tb_sft", "tb_rl", "judge_sft_model",
                         "judge_sft_merged", "judge_model", "tb_judge_sft", "tb_judge_grpo"})


# reward.judge's sections per provider: a stage that reads the whole of `reward` reads only the named provider's
JUDGE_SECTIONS = {"openai": "openai", "model": "model"}


def param_value(cfg: dict, key: str, tenant: dict | None = None):
    """The config node of dotted `key` that a stage's params hold (Snakemake reruns a job whose params differ).
    The whole of ``reward`` leaves out the settings of the judges ``reward.judge.provider`` does not name: the
    distilled judge's settings (reward.judge.model.rule_weight, say) change nothing the rule judge's reward check
    makes, and the check gates the student's training. A stage that reads them whatever the provider names them
    (judge_eval: reward.judge.model). ``teacher`` of a `tenant`'s job is that tenant's teacher (its own
    tenants[].teacher over the global block): the same value as before for a tenant without one, so adding the
    setting reruns nothing, and a tenant's own teacher reruns that tenant only; ``train.sft.targets`` likewise
    (tenants[].sft_targets)."""
    if key == "teacher" and tenant is not None:
        from ..config import tenant_teacher

        return tenant_teacher(cfg, tenant)
    if key == "train.sft.targets" and tenant is not None:
        from ..config import tenant_sft_targets

        return tenant_sft_targets(cfg, tenant)
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if key == "reward" and isinstance(node, dict) and isinstance(node.get("judge"), dict):
        judge = node["judge"]
        unused = {sec for prov, sec in JUDGE_SECTIONS.items() if prov != judge.get("provider")}
        node = {**node, "judge": {k: v for k, v in judge.items() if k not in unused}}
    return node


def jobs(s: Stage, cfg: dict, tenants: list[str] | None = None) -> list[tuple[dict | None, dict | None]]:
    """(tenant, candidate) of every job of stage `s` over `tenants` (names; default every tenant). A stage over
    all tenants runs only when every tenant is selected (the report covers them all)."""
    if s.switch and not switched_on(cfg, s.switch):
        return []
    names = [t["name"] for t in cfg["tenants"]] if tenants is None else tenants
    picked = [t for t in cfg["tenants"] if t["name"] in names]
    if s.student:  # a rules-only tenant trains nothing (and the base model is needed only where one trains)
        picked = [t for t in picked if has_student(t)]
        if s.per == "once":
            return [(None, None)] if any(has_student(t) for t in cfg["tenants"]) else []
    if s.per == "once":
        return [(None, None)]
    if s.per == "all_tenants":
        return [(None, None)] if len(picked) == len(cfg["tenants"]) else []
    if s.per == "demo_tenant":
        picked = [t for t in picked if t.get("demo_source")]
    if s.per == "candidate":  # the tenant's own candidates: no model for a rules-only tenant, none of a stage off
        return [(t, c) for t in picked for c in candidates(s, cfg) if c in tenant_candidates(cfg, t["name"])]
    return [(t, None) for t in picked]


def switched_off_keys(cfg: dict) -> set[str]:
    """The artifact keys the stages switched off by the config would write."""
    return {k for st in STAGES.values() if st.switch and not switched_on(cfg, st.switch)
            for a in st.args if a.role == "out" for k in a.keys}


def switched_on(cfg: dict, key: str) -> bool:
    """The boolean at dotted `key` of the config (a stage's `switch`)."""
    node = cfg
    for part in key.split("."):
        node = node[part]
    return bool(node)


def candidates(s: Stage, cfg: dict) -> list[dict]:
    """The eval candidates a per-candidate stage runs for: local models, or every other kind."""
    return [c for c in cfg["eval"]["candidates"] if (c["kind"] in MODEL_KINDS) == (s.candidates == "model")]


def resolve(key: str, tenant: str, given: dict, cfg: dict, candidate: str | None = None) -> str | list[str] | None:
    """The path of artifact `key` for tenant `tenant` (a name or a placeholder), or None for an optional file
    the tenant leaves out. `given`: the tenant's CONFIG_FILES and CANDIDATE_FILES values (or placeholders)."""
    if key in CONFIG_FILES or key in CANDIDATE_FILES:
        return given.get(key)
    if key == "base_model":
        return BASE_MODEL
    if key == "report_html":
        return REPORT_HTML
    if key == "deploy_json":
        return deploy_json(tenant)
    ev = eval_paths(tenant)

    def rewrites(name: str) -> str:  # replace, not format: `tenant` may be a placeholder in braces itself
        return ev["rewrites"].replace("{candidate}", name)

    if key == "rewrites":
        return rewrites(candidate)
    if key == "all_rewrites":
        return [rewrites(c["name"]) for c in tenant_candidates(cfg, tenant)]
    if key == "deploy_rewrites":
        return rewrites(cfg["deploy"]["candidate"])
    if key == "eval_split":
        key = cfg["eval"]["split"]
    paths = tenant_paths(tenant)
    return paths[key] if key in paths else ev[key]


# What a rules-only tenant (tenants[].student: never) has none of: a job's inputs of these keys are left out
STUDENT_KEYS = frozenset({"sft_merged", "rl_model", "rl_val_rewrites", "tb_sft", "tb_rl"})


def given_files(tenant: dict, cfg: dict, candidate: dict | None = None) -> dict:
    """The concrete CONFIG_FILES and CANDIDATE_FILES of one job."""
    from ..eval.candidates import deploy_candidate, model_path

    out = {k: tenant.get(k) for k in CONFIG_FILES} | {"kb": tenant["kb"]["path"]}
    if candidate is not None and candidate["kind"] in MODEL_KINDS:
        out["candidate_model"] = model_path(candidate, tenant)
    if cfg["deploy"]["candidate"] in {c["name"] for c in cfg["eval"]["candidates"]}:
        out["deploy_model"] = model_path(deploy_candidate(cfg), tenant)
    return out


def named_files(s: Stage, role: str, tenant: str, given: dict, cfg: dict,
                candidate: str | None = None) -> dict[str, str | list[str]]:
    """Input ("in") or output ("out") name → path of one job of `s` (a list for a multi-file argument), named
    like Snakemake's `{input.NAME}`: the argument's name (`queries`, `out`, `stats`), or off the command line
    the key. An optional file the tenant leaves out is absent."""
    named = [(a.name, a.keys) for a in s.args if a.role == role]
    named += [(k, (k,)) for k in (s.reads if role == "in" else s.writes)]
    if role == "in" and rules_only(cfg, tenant):
        named = [(n, keys) for n, keys in named if not STUDENT_KEYS & set(keys)]
    if role == "in":  # what a stage switched off (its `switch` false) would have made is no one's input
        off = switched_off_keys(cfg)
        named = [(n, keys) for n, keys in named if not off & set(keys)]
    out: dict[str, str | list[str]] = {}
    for name, keys in named:
        paths = [resolve(k, tenant, given, cfg, candidate) for k in keys]
        files = flat(p for p in paths if p is not None)
        if len(keys) > 1 or isinstance(paths[0], list):
            out[name] = files
        elif files:
            out[name] = files[0]
    return out


def flat(values) -> list[str]:
    """Paths, with each list of paths among `values` spliced in."""
    return [p for v in values for p in (v if isinstance(v, list) else [v])]


def job_files(s: Stage, role: str, tenant: dict | None, cfg: dict, candidate: dict | None = None) -> dict:
    """`named_files` of one concrete job; a stage over all tenants gets every tenant's files, as lists."""
    if s.per == "all_tenants" and s.reads and role == "in":
        out: dict[str, list] = {}
        for t in cfg["tenants"]:
            for name, p in named_files(s, role, t["name"], given_files(t, cfg), cfg).items():
                out.setdefault(name, []).extend(flat([p]))
        return out
    name = tenant["name"] if tenant else ""
    given = given_files(tenant, cfg, candidate) if tenant else {}
    return named_files(s, role, name, given, cfg, candidate and candidate["name"])


def job_threads(setting: int | str, cores: int | None, tenants: int) -> int:
    """Threads of one training / generation job. An integer is taken as given; `auto` shares the run's cores
    among its tenants, so on a CPU box the tenants' chains (sft → merge → rl → eval) run side by side: these
    jobs are full of single-threaded phases (start-up, data, scoring) and small ops that a second thread
    speeds up little (2 cores, Qwen2.5-0.5B LoRA SFT: two 1-thread jobs at once made about 1.5 times the steps
    of one 2-thread job alone)."""
    if setting != "auto":
        return int(setting)
    return max(1, int(cores or 1) // max(1, tenants))


def command(s: Stage, ins, outs, folder, *, config: str, tenant: str = "", candidate: str = "", threads="",
            server_log: str = "") -> str:
    """The stage's command line. `ins` / `outs`: the job's files by name (`named_files`, or Snakemake's
    input / output); `folder(key)`: the path of a working folder (a `dir` argument)."""

    def text(a: Arg) -> str | None:
        if a.role == "dir":
            return folder(a.keys[0])
        v = (ins if a.role == "in" else outs).get(a.name)
        if v is None:  # an input the job goes without (a rules-only tenant's models)
            return None
        return v if isinstance(v, str) else " ".join(v)

    parts = ["qrewrite", s.command]
    if s.uses_config:
        parts += ["--config", config]
    if s.per not in ("once", "all_tenants"):
        parts += ["--tenant", tenant]
    if s.per == "candidate":
        parts += ["--candidate", candidate]
    for a in s.args:
        value = text(a)
        if value is not None:
            parts += [a.flag, value]
    if s.threads and threads:  # none: the command's own default (all cores), as under `dvc repro`
        parts += ["--threads", str(threads)]
    if s.server_log:
        parts += ["--server-log", server_log]
    return " ".join(parts)


@cache
def upstream() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Artifact key → (the stage that makes it, the keys it makes it from): what `qrewrite lineage` walks back
    to the raw Excel. The data and training halves (lineage covers the models and what they learnt from)."""
    out = {}
    for s in STAGES.values():
        if s.half in ("data", "models"):
            ins = tuple(dict.fromkeys(s.keys("in")))
            for k in s.keys("out"):
                out[k] = (s.name, ins)
    return out
