"""The package's layers import one way: no two parts of marlctl import each other, directly or
through others (imports inside functions included)."""

from __future__ import annotations

import ast
import re
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


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of marlctl it imports, each named as far as it is a module
    (`from marlctl.train.runner import X` -> `marlctl.train.runner`; a name that is no module
    -> its package)."""
    modules = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE.rglob("*.py")
    }

    def module_of(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        source = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = source.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("marlctl.") and module_of(name) != source:
                    graph.setdefault(source, set()).add(module_of(name))
    return graph


def _within(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The imports among the modules (and subpackages, each as one) of one package."""
    depth = package.count(".") + 1

    def child(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return ".".join(module.split(".")[: depth + 1])

    inside: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if (mine := child(source)) is None:
            continue
        for target in targets:
            if (other := child(target)) is not None and other != mine:
                inside.setdefault(mine, set()).add(other)
    return inside


def _packages() -> list[str]:
    return sorted(
        ".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
    )


def test_no_two_modules_of_a_package_import_each_other():
    graph = _module_graph()
    assert "marlctl.train.runner" in graph  # the graph was read
    found = {package: _cycles(_within(graph, package)) for package in _packages()}
    assert {package: cycles for package, cycles in found.items() if cycles} == {}


def test_the_trainer_of_every_algorithm_is_the_class_it_registers():
    import importlib

    from marlctl.algos import registered_algos
    from marlctl.train.build import trainer_class

    for name, algo in registered_algos().items():
        module, _, cls = algo.trainer.partition(":")
        assert trainer_class(name) is getattr(importlib.import_module(module), cls), name


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
LONGEST_MODULE = 500  # lines, anywhere in the package
LONGEST_FUNCTION = 80  # lines, in the modules a spec passes through before training
PIPELINE = ("cli", "spec", "plan.py", "launch.py", "train/runner.py", "train/lifecycle.py")


def _layers() -> dict[str, int]:
    """Part -> layer, from the table of docs/architecture.md."""
    layers = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].isdigit():
            for part in re.findall(r"`([\w.]+)`", cells[1]):
                layers[f"marlctl.{part}"] = int(cells[0])
    return layers


def test_every_part_imports_only_parts_of_lower_layers():
    layers = _layers()
    graph = _import_graph()
    parts = set(graph) | {p for targets in graph.values() for p in targets}
    assert sorted(parts - set(layers)) == []  # every part has its layer in the docs
    upward = {
        f"{source} -> {target}": (layers[source], layers[target])
        for source, targets in graph.items()
        for target in targets
        if layers[target] >= layers[source]
    }
    assert upward == {}


def test_no_module_is_longer_than_the_limit():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST_MODULE
    }
    assert long == {}


def test_no_function_on_the_way_to_training_is_longer_than_the_limit():
    long = {}
    for name in PIPELINE:
        root = PACKAGE / name
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LONGEST_FUNCTION:
                        long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = lines
    assert long == {}
