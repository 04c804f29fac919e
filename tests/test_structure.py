"""The package's layers import one way: no two parts of marlctl import each other, directly or
through others (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "marlctl"


def _part(module: str) -> str:
    """`marlctl.sweep.study` -> `marlctl.sweep`: the unit whose imports are compared."""
    return ".".join(module.split(".")[:2])


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = _part(module.removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                base = node.module
                names = [f"{base}.{a.name}" for a in node.names] if base == "marlctl" else [base]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                target = _part(name)
                if name.startswith("marlctl.") and target != source:
                    graph.setdefault(source, set()).add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_parts_of_the_package_import_each_other():
    graph = _import_graph()
    assert "marlctl.spec" in graph and "marlctl.sweep" in graph  # the graph was read
    assert _cycles(graph) == []
