"""The package's layers, stated and checked (docs/code.md "Layers"): every import in qrewrite/ (module level and
inside functions alike, parsed with ast) goes from a package to one in a lower layer, never to its own layer's
peers or above, save the named exceptions below; and no two packages import each other round a circle.

A package is a folder of qrewrite/ (its sub-packages count as it: training/rl/verl is training); the modules at the
top of qrewrite/ are `shared`, except qrewrite/cli.py and __main__.py, the top (`cli`). The packages are read off
the file tree, so a package that is not in LAYERS fails the test until it is placed.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "qrewrite"

# Bottom to top; the packages of one layer do not import each other.
LAYERS = (
    ("shared",),                          # config, paths, io_utils, metrics, stats, text, entities, ...
    ("lineage",),                         # what a model folder holds and which image runs: below every stage
    ("data", "rag"),                      # ingest and the Excel; the RAG providers and validation
    ("teacher",),                         # on rag's local retriever
    ("reward",),                          # on data's rows and rag
    ("runtime",),                         # what a release does with a request: on reward's scorer and rag
    ("eval",),                            # scores candidates through the runtime
    ("workflow",),                        # the stage table (its eval candidates) and each model's lineage record
    ("training", "release", "report"),    # stages that record lineage or read the eval
    ("judge", "serve"),                   # the distilled judge trains like the student; the gateway
    ("deploy", "onboard"),                # the deploy check serves through the gateway; tenant init
    ("cli",),                             # qrewrite/cli.py registers every package's subcommands
)

# The imports that go up, each with its reason (docs/code.md states the same list): (file, module imported).
EXCEPTIONS = {
    ("qrewrite/envs.py", "qrewrite.lineage.container"):
        "ensure_env refuses to re-run a command in a training env from inside a container image, which "
        "lineage.container recognises (it records the image in lineage.json)",
    ("qrewrite/lineage/show.py", "qrewrite.data.excel"):
        "`qrewrite lineage trace` prints a sample's raw Excel row read as the data stage reads it (read_excel), "
        "inside the function that prints it",
}


def package_of(module: str, root: Path) -> str | None:
    """The layer package of dotted module `module` (None outside qrewrite)."""
    parts = module.split(".")
    if parts[0] != "qrewrite":
        return None
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli" if len(parts) > 1 else "shared"
    return parts[1] if (root / parts[1]).is_dir() else "shared"


def imports(root: Path) -> list[tuple[str, str, int]]:
    """(file relative to root's parent, module imported, line) of every qrewrite import under `root`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = list(rel.with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts if is_init else parts[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # `from .. import stats`: the names may be modules
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            out += [(rel.as_posix(), m, node.lineno) for m in names if m.split(".")[0] == "qrewrite"]
    return out


def check_layers(root: Path, layers=LAYERS, exceptions=EXCEPTIONS) -> dict[str, list]:
    """{unplaced, upward, cycles, stale}: packages under `root` in no layer; imports to the same layer or above
    (not in `exceptions`); circles of packages (over every import but the exceptions); exceptions that no longer
    happen."""
    rank = {p: i for i, layer in enumerate(layers) for p in layer}
    packages = {"shared", "cli"} | {d.name for d in root.iterdir() if (d / "__init__.py").is_file()}
    found = imports(root)
    graph: dict[str, set[str]] = defaultdict(set)
    upward, used = [], set()
    for file, module, line in found:
        src = package_of(".".join(Path(file).with_suffix("").parts), root)
        dst = package_of(module, root)
        if src == dst or dst is None:
            continue
        key = next((k for k in exceptions if k[0] == file and (module + ".").startswith(k[1] + ".")), None)
        if key is not None:
            used.add(key)
            continue
        graph[src].add(dst)
        if src in rank and dst in rank and rank[dst] >= rank[src]:
            upward.append(f"{file}:{line} imports {module} ({src} -> {dst})")
    return {"unplaced": sorted(packages - set(rank)), "upward": upward, "cycles": cycles(graph),
            "stale": sorted(f"{f} -> {m}" for f, m in set(exceptions) - used)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of packages (Tarjan), each as the packages in it."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_import_goes_down_the_layers_and_no_packages_import_each_other_round_a_circle():
    found = check_layers(PACKAGE)
    assert found == {"unplaced": [], "upward": [], "cycles": [], "stale": []}


def test_the_exceptions_are_few_and_stated_in_docs_code_md():
    assert len(EXCEPTIONS) <= 3
    layers = (REPO / "docs" / "code.md").read_text(encoding="utf-8").split("\nLayers", 1)[1]
    for file, module in EXCEPTIONS:
        assert f"`{file}` → `{module}`" in layers, (file, module)
    order = " < ".join(" ".join(f"`{p}`" for p in layer) for layer in LAYERS[1:-1])
    assert re.sub(r"\s+", " ", order) in re.sub(r"\s+", " ", layers), order


@pytest.fixture
def planted(tmp_path) -> Path:
    """A copy of qrewrite/ to plant imports in."""
    root = tmp_path / "qrewrite"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_a_planted_upward_import_a_circle_and_an_unplaced_package_are_caught(planted):
    assert check_layers(planted)["upward"] == []
    # the runtime reaching up into the eval, inside a function (the imports the module-level grep missed)
    route = planted / "runtime" / "route.py"
    route.write_text(route.read_text(encoding="utf-8") + "\n\ndef _planted():\n    from ..eval import score\n",
                     encoding="utf-8")
    found = check_layers(planted)
    assert [u.split(":", 1)[0] for u in found["upward"]] == ["qrewrite/runtime/route.py"]
    assert "(runtime -> eval)" in found["upward"][0] and ["eval", "runtime"] in found["cycles"]
    # peers of one layer do not import each other either; `from .. import x` is read as module x
    (planted / "rag" / "planted.py").write_text("from ..data import ingest\n", encoding="utf-8")
    assert any("(rag -> data)" in u for u in check_layers(planted)["upward"])
    # a new package is placed before it passes
    (planted / "newpkg").mkdir()
    (planted / "newpkg" / "__init__.py").write_text("", encoding="utf-8")
    assert check_layers(planted)["unplaced"] == ["newpkg"]


def test_an_exception_that_no_longer_happens_is_reported(planted):
    show = planted / "lineage" / "show.py"
    show.write_text(show.read_text(encoding="utf-8").replace("from ..data.excel import read_excel", "read_excel = None"),
                    encoding="utf-8")
    assert check_layers(planted)["stale"] == ["qrewrite/lineage/show.py -> qrewrite.data.excel"]
