"""Read a spec or preset file (YAML or TOML) into plain data plus a line for every key path."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marlctl.errors import Problem, SpecError


@dataclass
class SourceFile:
    path: Path
    data: dict[str, Any]
    lines: dict[str, int] = field(default_factory=dict)  # "algo.lr" -> 1-based line
    package: str = ""  # key prefix a preset file is placed under (Hydra's `# @package`)

    def line_of(self, dotted: str) -> int | None:
        """Line of `dotted` or of its nearest ancestor present in the file."""
        rel = self._relative(dotted)
        if rel is None:
            return None
        parts = rel.split(".") if rel else []
        while parts:
            key = ".".join(parts)
            if key in self.lines:
                return self.lines[key]
            parts.pop()
        return None

    def defines(self, dotted: str) -> bool:
        rel = self._relative(dotted)
        return rel is not None and rel in self.lines

    def _relative(self, dotted: str) -> str | None:
        if not self.package:
            return dotted
        if dotted == self.package:
            return ""
        if dotted.startswith(self.package + "."):
            return dotted[len(self.package) + 1 :]
        return None


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float, as YAML 1.2 and OmegaConf do."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_source(path: Path, display: str | None = None) -> SourceFile:
    """Parse `path`; raise SpecError (with the file's line) when it cannot be read."""
    shown = display or str(path)
    if not path.is_file():
        raise SpecError([Problem(shown, None, "", "no such file")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([Problem(shown, None, "", f"cannot read file: {err}")]) from None
    if path.suffix.lower() == ".toml":
        data, lines, problems = _parse_toml(text, shown)
    elif path.suffix.lower() in (".yaml", ".yml"):
        data, lines, problems = _parse_yaml(text, shown)
    else:
        problems = [Problem(shown, None, "", "spec must be a .yaml, .yml or .toml file")]
        data, lines = {}, {}
    if problems:
        raise SpecError(problems)
    package = ""
    header = re.match(r"\s*#\s*@package\s+(\S+)", text)
    if header and header.group(1) != "_global_":
        package = header.group(1)
    return SourceFile(path, data, lines, package)


def _parse_yaml(text: str, shown: str) -> tuple[dict, dict[str, int], list[Problem]]:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {}, []
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as err:
        # At the end of the input the problem mark lies past the last line; the context mark
        # (where the unfinished construct began) is what the user needs then.
        last_line = max(1, len(text.splitlines()))
        mark = err.problem_mark
        if (mark is None or mark.line + 1 > last_line) and err.context_mark is not None:
            mark = err.context_mark
        line = min(mark.line + 1, last_line) if mark else None
        message = " ".join(str(s) for s in (err.context, err.problem) if s)
        return {}, {}, [Problem(shown, line, "", f"invalid YAML: {message}")]
    except yaml.YAMLError as err:
        return {}, {}, [Problem(shown, None, "", f"invalid YAML: {err}")]
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        return {}, {}, [Problem(shown, 1, "", "the top level must be a mapping of keys")]
    lines: dict[str, int] = {}
    problems: list[Problem] = []
    _walk_yaml(node, "", lines, problems, shown)
    return data, lines, problems


def _walk_yaml(node: yaml.Node, prefix: str, lines: dict, problems: list, shown: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            if key in seen:
                problems.append(Problem(shown, key_node.start_mark.line + 1, path, "duplicate key"))
            seen.add(key)
            lines[path] = key_node.start_mark.line + 1
            _walk_yaml(value_node, path, lines, problems, shown)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = f"{prefix}.{index}"
            lines[path] = item.start_mark.line + 1
            _walk_yaml(item, path, lines, problems, shown)


_TOML_LINE_ERROR = re.compile(r"\(at line (\d+), column \d+\)")
_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'))*)\s*="""
)


def _toml_key(raw: str) -> str:
    return ".".join(
        part.strip().strip("\"'")
        for part in re.split(r"\.(?=(?:[^\"']*[\"'][^\"']*[\"'])*[^\"']*$)", raw)
    )


def _parse_toml(text: str, shown: str) -> tuple[dict, dict[str, int], list[Problem]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        found = _TOML_LINE_ERROR.search(str(err))
        message = _TOML_LINE_ERROR.sub("", str(err)).strip()
        line = int(found.group(1)) if found else None
        return {}, {}, [Problem(shown, line, "", f"invalid TOML: {message}")]
    # tomllib keeps no positions: recover them from table headers and `key =` lines.
    lines: dict[str, int] = {}
    table = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _TOML_TABLE.match(raw)
        if header:
            table = _toml_key(header.group(1))
            lines.setdefault(table, number)
            continue
        key = _TOML_KEY.match(raw)
        if key:
            path = _toml_key(key.group(1))
            lines.setdefault(f"{table}.{path}" if table else path, number)
    return data, lines, []
