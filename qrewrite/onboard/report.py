"""`qrewrite tenant init`'s printed report (each proposal with its evidence, then the tenant block) and the commands
that follow it."""

from __future__ import annotations

import unicodedata

from .block import tenant_yaml
from .rows import max_query_chars
from .teachers import fmt


def next_commands(p: dict, written: bool) -> list[str]:
    """README "Your own tenant in five minutes", step 3 and 4, for this tenant."""
    name, cfg_flag = p["name"], "" if p["config_is_default"] else f" --config {p['config']}"
    snake = "" if p["config_is_default"] else f" --configfile {p['config']}"
    out = [] if written else [f"add the block under `tenants:` in {p['config']} (or rerun with --write)"]
    if p["tenant"]["teacher"]["provider"] == "openai":
        out.append("export OPENAI_API_KEY=...   # teacher.openai.api_key_env; teacher.openai names the model "
                   "(README \"Pointing at real services\")")
    if not p["excel"]["inside"]:
        out.append(f"the Excel is outside the project: put it at data/raw/{name}.xlsx and set raw_excel (README "
                   "step 1)")
    steps = [(f".venv/bin/qrewrite config{cfg_flag} > /dev/null", "validates the config"),
             (f".venv/bin/snakemake --cores 2 -n data --config only={name}{snake}", "plan (a dry run writes nothing)"),
             (f".venv/bin/snakemake --cores 2 data --config only={name}{snake}",
              f"data half: results/{name}/summary.json"),
             (f".venv/bin/snakemake --cores 2 --config only={name}{snake}", f"+ SFT, RL and eval (reports/{name}/)"),
             (".venv/bin/qrewrite dvc-yaml", "dvc.yaml lists each tenant's stages: regenerate it, commit it")]
    width = max(len(c) for c, _ in steps) + 2
    return out + [f"{c:<{width}}# {why}" for c, why in steps]


def _pad(text: str, width: int) -> str:
    """`text` padded to `width` terminal columns (a CJK character takes two)."""
    cols = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(1, width - cols)


def _table(items: dict, evidence: dict) -> list[str]:
    return [f"  {_pad(key, 12)}{_pad('null' if v is None else str(v), 14)}{evidence[key]}" for key, v in items.items()]


def render_report(p: dict) -> str:
    """The readable report: each proposal with its evidence, then the tenant block."""
    x, k, g, lang, t = p["excel"], p["kb"], p["gold"], p["language"], p["teacher"]
    out = [f"qrewrite tenant init {p['name']}: {x['path']} (sheet {x['sheet']!r}, {x['rows']} questions) + "
           f"{k['path']} ({k['docs']} documents)", "",
           f"Columns (header: {', '.join(h for h in x['header'] if h)}; first {x['sample_rows']} rows read)"]
    out += _table(p["columns"], p["column_evidence"])
    out += ["", f"KB fields (keys of the first {k['sample_lines']} lines: {', '.join(map(str, k['keys']))})"]
    out += _table(p["fields"], p["field_evidence"])
    gold_line = (f"  gold ids: {g['in_kb']} of {g['cited']} cited in the sheet's rows are in the KB; "
                 f"{g['rows_with_gold']} of {g['rows']} rows have gold") if p["columns"]["gold"] else \
        "  gold ids: no gold column: Hit@1 cannot be measured on this sheet"
    out.append(gold_line)
    if x["too_long"]:  # ingest drops them too (data.ingest.build_rows): they are in no figure here
        out.append(f"  left out: {x['too_long']} questions longer than tenants[].thresholds.max_query_chars "
                   f"({max_query_chars()} characters), as ingest drops them")
    if g["missing"]:
        out.append("  not in the KB: " + ", ".join(f"{gid} (row {row})" for gid, row in g["missing"])
                   + " (ingest stops when over 10 % of the cited ids are missing: thresholds.max_missing_gold_share)")
    out += ["", f"Language: {lang['language']}", f"  {lang['evidence']}", ""]
    fit = t["fit"]
    if fit["n"]:
        out.append(f"Teacher (tie-aware Hit@1 through the tenant's local BM25 on {fit['n']} rows with gold, sampled "
                   f"with seed {t['seed']}, --sample {t['sample']})")
        out += [f"  raw query        {fmt(fit['raw'])}", f"  query + history  {fmt(fit['query_history'])}",
                f"  resolve          {fmt(fit['resolve'])}"
                + ("       (cannot start on this KB)" if fit["resolve_error"] else
                   f"   referent written in {fit['referents']} of {fit['n']} rows")]
        if fit["column"] is not None:
            out.append(f"  column           {fmt(fit['column'])}   (the sheet's rewrites, {p['columns']['rewrite']})")
    else:
        out.append("Teacher (no rows with gold documents in the KB to score on)")
    out += [f"  {r}" for r in t["reasons"]]
    out.append(f"  → teacher: {{provider: {t['provider']}}}")
    if p["exists"]:
        out += ["", f"Note: a tenant named {p['name']!r} is already in {p['config']}: --write refuses it"]
    out += ["", f"Tenant block (under `tenants:` in {p['config']}):", "",
            tenant_yaml(p["tenant"], 2, p["notes"]).rstrip("\n")]
    return "\n".join(out)
