"""The layout holds (issue "One house for many training methods"): imports in jobs/ and kernels/ point
one way, with no circle between modules, and no package imports one above it.

Every import counts, also one inside a function (a late import that dodges a circle is still a
circle); only imports under `if TYPE_CHECKING:` are left out, since they never run."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# Floors, lowest first. A module may import its own package and the floors below it; packages on
# the same floor may not import each other (the queue never imports train, nor train the queue).
FLOORS = [
    {"kernels.ops"},
    {"kernels"},
    {"jobs.errors", "jobs.messages"},
    {"jobs.yaml_bounded", "jobs.spec_values"},
    {"jobs.spec"},
    {"jobs.io"},
    {"jobs.launch", "jobs.models"},
    {"jobs.data"},
    {"jobs.checks", "jobs.export"},
    {"jobs.train", "jobs.queue"},
    {"jobs.serve"},   # serves finished jobs on the trainer's decode loop
    {"jobs.evaluate"},   # scores a finished job on jobs.serve's model and engine
]
FLOOR_OF = {name: level for level, names in enumerate(FLOORS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The floor a module lives on: kernels.ops.x -> kernels.ops, kernels.patch -> kernels,
    jobs.io.paths -> jobs.io, jobs.spec -> jobs.spec."""
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels.ops" if parts[1:2] == ["ops"] else "kernels"
    return ".".join(parts[:2])


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The repo modules a file imports (resolved to modules where a name is a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif node.module in known:
                    found.add(node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for top in ("jobs", "kernels") for p in (ROOT / top).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) - {module_name(p)} for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_jobs_or_kernels():
    assert cycles(import_graph()) == []


def test_no_arrow_points_up_or_sideways():
    wrong = []
    for module, targets in import_graph().items():
        if module in ("jobs", "kernels"):
            continue
        source = package_of(module)
        for target in targets:
            destination = package_of(target)
            if destination == source or target in ("jobs", "kernels"):
                continue
            if FLOOR_OF[destination] >= FLOOR_OF[source]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_every_package_is_on_a_floor():
    packages = {package_of(m) for m in import_graph() if m not in ("jobs", "kernels")}
    assert packages <= set(FLOOR_OF), packages - set(FLOOR_OF)


def test_cycle_finder_sees_a_late_import():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    tree_lines = _type_checking_lines(ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"))
    assert tree_lines == {3}


def test_jobs_keeps_few_top_level_modules_and_short_files():
    top = [p.name for p in (ROOT / "jobs").glob("*.py")]
    assert len(top) <= 8, top
    long = [str(p.relative_to(ROOT)) for top_dir in ("jobs", "kernels", "studio", "bench")
            for p in (ROOT / top_dir).rglob("*.py") if len(p.read_text(encoding="utf-8").splitlines()) > 400]
    assert long == []


def test_every_package_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "jobs").rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert missing == []


def test_bench_readme_names_every_script():
    readme = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in (ROOT / "bench").glob("*.py") if f"`{p.name}`" not in readme]
    assert missing == [], "add a line to bench/README.md for each"
