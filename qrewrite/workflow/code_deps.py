"""The qrewrite source files one subcommand runs, found statically, for dvc.yaml's code deps.

A stage's code is the import closure of its handler (`cmd_split` in qrewrite/data/cli.py, ...) inside the
qrewrite package, computed with `ast` (no import, no list kept by hand, so it cannot go stale):

* the handler's own module: its module-level imports, plus the imports inside the handler and inside the
  module's functions the handler calls by name (a package's cli.py imports each of its stages' code lazily
  inside the handler, so the whole module's imports would give a stage its neighbours' code);
* every module reached from there: all its imports, at module level or inside functions (conservative:
  a lazy import runs when its function does);
* the `__init__.py` of each package on the way, which Python runs on import.

`qrewrite/cli.py` imports every stage package's `cli` module to register its subcommands: those are
registration, not the stage's code, so a stage's closure takes only its own handler's `cli` module (editing
the eval's arguments does not rerun the split). Only qrewrite/cli.py may import a `cli` module
(`registration_importers` finds any other importer, and the tests require there be none).

Files a stage hands to another program by path (the reward plugins `qrewrite rl` gives ms-swift and verl)
are not imports: the caller names them as extra entry modules.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = "qrewrite"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def module_file(module: str) -> Path | None:
    """The source file of qrewrite module `module` (dotted), None if there is none."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module:
    return ast.parse(module_file(module).read_text(encoding="utf-8"))


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> set[str]:
    """The qrewrite modules an import statement in `module` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        pkg = module if module_file(module).name == "__init__.py" else module.rsplit(".", 1)[0]
        if node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
            base = ".".join(base + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        # `from .pkg import name`: name is a submodule or an attribute of base
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    return {n for n in names if module_file(n) is not None}


def _imports_in(nodes, module: str) -> set[str]:
    out: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out |= _targets(node, module)
    return out


def _handler_imports(module: str, function: str) -> set[str]:
    """Module-level imports of `module` plus those of `function` and of the module's functions it calls."""
    tree = _tree(module)
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if function not in funcs:
        raise ValueError(f"{module} has no function {function!r}")
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = _imports_in(top, module)
    todo, seen = [function], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        out |= _imports_in([funcs[name]], module)
        # calls only: a function passed as a value (build_parser's `func=cmd_split`) is not run here
        todo += [n.func.id for n in ast.walk(funcs[name])
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs]
    return out


def _with_packages(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def module_name(path: str | Path) -> str:
    """The dotted name of qrewrite source file `path`."""
    rel = Path(path).resolve().relative_to(PACKAGE_DIR).with_suffix("")
    return ".".join([PACKAGE, *(rel.parts[:-1] if rel.name == "__init__" else rel.parts)])


def is_registration(module: str) -> bool:
    """A stage package's `cli` module: `qrewrite.cli` imports it only to register its subcommands."""
    return module != f"{PACKAGE}.cli" and module.rsplit(".", 1)[-1] == "cli"


def registration_importers() -> dict[str, set[str]]:
    """Modules other than qrewrite.cli that import a stage `cli` module (should be none)."""
    out = {}
    for f in PACKAGE_DIR.rglob("*.py"):
        m = module_name(f)
        hits = {t for t in _imports_in([_tree(m)], m) if is_registration(t)}
        if m != f"{PACKAGE}.cli" and hits:
            out[m] = hits
    return out


def closure(handlers: list[tuple[str, str]], extra_modules: tuple[str, ...] = ()) -> list[Path]:
    """Source files run by `handlers` ((module, function name) each) and by `extra_modules`, sorted."""
    seen = {m for m, _ in handlers}  # their files are deps, but only the handlers' share of their imports is followed
    todo = [*extra_modules]
    for module, function in handlers:
        todo += [*_handler_imports(module, function), *_with_packages(module)]
    while todo:
        m = todo.pop()
        if is_registration(m):  # another stage's subcommands: only its package's __init__ runs for this stage
            todo += sorted(_with_packages(m.rsplit(".", 1)[0]) - seen)
            continue
        for m in _with_packages(m) - seen:
            seen.add(m)
            todo += sorted(_imports_in([_tree(m)], m) - seen)
    return sorted(module_file(m) for m in seen)
