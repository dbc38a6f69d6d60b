"""jobrunner's import graph is a tree of layers: no module cycles, no imports of another
module's private names (`from x import _name`). Read from source with ast, so an import inside a
function or under TYPE_CHECKING counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jobrunner"


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name: str, file: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for each import in `file`."""
    is_pkg = file.name == "__init__.py"
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                module = ".".join(base)
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((sub, None) if sub in known else (module, a.name))
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    private = []
    for m, f in known.items():
        for target, taken in imports(m, f, known):
            if not target.startswith("jobrunner"):
                continue
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target == m or target not in known:
                continue
            edges[m].add(target)
            if taken and taken.startswith("_") and not taken.startswith("__"):
                private.append(f"{m} imports {target}.{taken}")
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_module_cycles():
    assert cycles(graph()[0]) == []


def test_no_module_imports_another_modules_private_names():
    assert graph()[1] == []


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path):
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    probe = tmp_path / "probe.py"
    probe.write_text("from jobrunner.pipeline import _hidden\nfrom .. import registry\n")
    found = imports("jobrunner.formats.probe", probe, modules())
    assert ("jobrunner.pipeline", "_hidden") in found
    assert ("jobrunner.registry", None) in found  # relative, resolved from the module's name
