"""Read a spec or preset file (YAML or TOML) into plain data plus a line for every key path."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marlctl.errors import Problem, SpecError

# Bounds on what a spec may be, so hostile input fails fast instead of exhausting memory,
# the stack or the user's patience: specs are a few kilobytes and a few levels deep.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000  # values after YAML aliases are expanded


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
    try:
        if not path.is_file():
            raise SpecError([Problem(shown, None, "", "no such file")])
        if path.stat().st_size > MAX_BYTES:
            raise SpecError([Problem(shown, None, "", f"larger than {MAX_BYTES >> 20} MiB")])
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError([Problem(shown, None, "", f"cannot read file: {err.strerror}")]) from None
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise SpecError([Problem(shown, line, "", "not UTF-8 text")]) from None
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
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as err:  # a character YAML does not allow
        line = text[: err.position].count("\n") + 1
        message = f"invalid YAML: character U+{err.character:04X} is not allowed"
        return {}, {}, [Problem(shown, line, "", message)]
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {}, []
        too_big = _check_nodes(node, shown)
        if too_big:
            return {}, {}, [too_big]
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
    except RecursionError:  # the composer recurses once per nesting level
        line = _yaml_too_deep(text)
        return {}, {}, [Problem(shown, line, "", f"nested deeper than {MAX_DEPTH} levels")]
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        return {}, {}, [Problem(shown, 1, "", "the top level must be a mapping of keys")]
    lines: dict[str, int] = {}
    problems: list[Problem] = []
    _walk_yaml(node, "", lines, problems, shown)
    return data, lines, problems


def _yaml_too_deep(text: str) -> int | None:
    """The line of the first value nested deeper than MAX_DEPTH, read from the parser's
    events (which keep no stack of Python frames, unlike the composer)."""
    open_collections = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionEndEvent):
                open_collections -= 1
                continue
            if isinstance(event, yaml.NodeEvent) and open_collections + 1 > MAX_DEPTH:
                return event.start_mark.line + 1
            if isinstance(event, yaml.CollectionStartEvent):
                open_collections += 1
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        return mark.line + 1 if mark is not None else None
    return None


def _check_nodes(root: yaml.Node, shown: str) -> Problem | None:
    """The problem with a YAML node graph that is too deep, too large once its aliases are
    expanded (a "billion laughs" bomb), or that contains itself; None when it is fine."""
    expanded: dict[int, int] = {}  # id(node) -> values below it, aliases expanded
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    open_nodes: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        line = node.start_mark.line + 1
        if done:
            open_nodes.discard(id(node))
            total = 1 + sum(expanded[id(child)] for child in _children(node))
            if total > MAX_NODES:
                return Problem(
                    shown, line, "", f"more than {MAX_NODES:,} values once aliases expand"
                )
            expanded[id(node)] = total
            continue
        if id(node) in expanded:  # met again through an alias: counted already
            continue
        if depth > MAX_DEPTH:
            return Problem(shown, line, "", f"nested deeper than {MAX_DEPTH} levels")
        open_nodes.add(id(node))
        stack.append((node, depth, True))
        for child in _children(node):
            if id(child) in open_nodes:  # an ancestor: the graph has a cycle
                return Problem(shown, line, "", "an alias refers to a node that contains it")
            stack.append((child, depth + 1, False))
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _walk_yaml(node: yaml.Node, prefix: str, lines: dict, problems: list, shown: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            if key == "":
                problems.append(Problem(shown, key_node.start_mark.line + 1, prefix, _EMPTY_KEY))
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


_EMPTY_KEY = "an empty key: every key needs a name"


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
    except RecursionError:  # tomllib recurses once per nested array or inline table
        line = _toml_too_deep(text)
        return {}, {}, [Problem(shown, line, "", f"nested deeper than {MAX_DEPTH} levels")]
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
    deep = _too_deep_path(data)
    if deep is not None:
        line = _toml_too_deep(text) or _nearest_line(deep, lines)
        return {}, {}, [Problem(shown, line, "", f"nested deeper than {MAX_DEPTH} levels")]
    problems = [
        Problem(shown, _nearest_line(path, lines), ".".join(path[:-1]), _EMPTY_KEY)
        for path in _empty_keys(data)
    ]
    problems.sort(key=lambda p: p.line or 0)
    return data, lines, problems


def _nearest_line(path: list[str], lines: dict[str, int]) -> int | None:
    """The line of `path`, of its nearest ancestor whose line is known, or else of the
    first key below it (a table header that names a whole deep path at once)."""
    for end in range(len(path), 0, -1):
        line = lines.get(".".join(path[:end]))
        if line is not None:
            return line
    below = [n for key, n in lines.items() if key.startswith(".".join(path) + ".")]
    return min(below, default=None)


def _empty_keys(data: Any) -> list[list[str]]:
    """Key paths (list indices left out) that end in an empty key."""
    found: list[list[str]] = []
    stack: list[tuple[Any, list[str]]] = [(data, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "":
                    found.append([*path, ""])
                stack.append((value, [*path, str(key)]))
        elif isinstance(item, list):
            stack.extend((value, path) for value in item)
    return sorted(found)


def _too_deep_path(data: Any) -> list[str] | None:
    """The key path (list indices left out) of a value nested deeper than MAX_DEPTH."""
    stack: list[tuple[Any, int, list[str]]] = [(data, 1, [])]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return path
        if isinstance(item, dict):
            stack.extend((v, depth + 1, [*path, str(k)]) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, depth + 1, path) for v in item)
    return None


def _toml_too_deep(text: str) -> int | None:
    """The line where arrays and inline tables first open deeper than MAX_DEPTH levels, read
    from the text (tomllib keeps no positions): brackets outside strings and comments."""
    depth, line, index, quote = 0, 1, 0, ""
    while index < len(text):
        char = text[index]
        if char == "\n":
            line += 1
        elif quote:
            if char == "\\" and quote[0] == '"':
                index += 1  # an escaped character, a quote among them
            elif text.startswith(quote, index):
                index += len(quote) - 1
                quote = ""
        elif char == "#":
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        elif char in "\"'":
            quote = char * 3 if text.startswith(char * 3, index) else char
            index += len(quote) - 1
        elif char in "[{":
            header = depth == 0 and not text[text.rfind("\n", 0, index) + 1 : index].strip()
            if header and char == "[":  # a table header: `[table]` or `[[array.of.tables]]`
                end = text.find("\n", index)
                index = len(text) if end < 0 else end
                continue
            depth += 1
            if depth + 1 > MAX_DEPTH:
                return line
        elif char in "]}":
            depth = max(0, depth - 1)
        index += 1
    return None
