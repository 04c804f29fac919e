"""Hydra's and pydantic's errors, and an env's, as Problems placed on the spec's lines."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from marlctl.errors import Problem
from marlctl.spec.models import model_fields_at
from marlctl.spec.provenance import OVERRIDES, PRESET_GROUPS, Provenance, preset_roots
from marlctl.spec.source import SourceFile


def first_line(err: Exception) -> str:
    """An error's first line, with a quoted value that runs over lines (a name holding a
    newline) kept whole, and runs of spaces as one (Hydra pads some messages)."""
    lines = str(err).strip().splitlines()
    if not lines:
        return type(err).__name__
    line, rest = lines[0], iter(lines[1:])
    while line.count("'") % 2:
        following = next(rest, None)
        if following is None:
            break
        line += "\n" + following
    return re.sub(r" {2,}", " ", line)


_ANTLR_INPUT = re.compile(r"^(?:extraneous|mismatched) input '(.*)' expecting")
_ANTLR_UNREAD = re.compile(
    r"^(?:no viable alternative at input|token recognition error at:) '(.*)'$"
)


def unparsed(text: str, error: str) -> str:
    """What is wrong with an override Hydra's grammar does not read, in a few words (its
    parser names the tokens it expected instead)."""
    found = _ANTLR_INPUT.match(error)
    if found and found[1] == "=" and text.count("=") > 1:
        return (
            "bad override: a second '='; write KEY=VALUE, and quote a value that holds "
            "'=' (key='a=b')"
        )
    if found:
        quote = " (quote a value that holds it)" if found[1] != "<EOF>" else ""
        return f"bad override: unexpected '{found[1]}'{quote}"
    if error.startswith("missing EQUAL"):
        return "bad override: no '='; write KEY=VALUE (or ~KEY to delete a key)"
    found = _ANTLR_UNREAD.match(error)
    if found:
        piece = found[1]
        if piece[:1] in ("'", '"'):
            return f"bad override: a quote left open at {piece}"
        if piece.isspace():
            return "bad override: a space outside quotes"
        if any(c in piece for c in "[{(") and text.endswith(piece):
            return f"bad override: cannot read {piece}: a bracket or parenthesis left open?"
        if len(piece) > 1:
            return f"bad override: cannot read {piece}"
        return f"bad override: unexpected '{piece}'"
    return f"bad override: {error.split(' expecting ')[0]}"


PRESET_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


def not_a_preset(choice: Any) -> str:
    return f"'{choice}' is not a preset name (letters, digits, _ and -; no paths)"


NO_HYDRA = "Hydra's own settings do not apply: marlctl composes specs, it runs no Hydra app"


def unknown_key_problem(key: str, index: int, text: str = "") -> Problem:
    """Override `index` sets a key the spec does not have: the field meant, or how to add it."""
    bare = key.lstrip("+~")
    if bare.split("@")[0] in PRESET_GROUPS:
        # Hydra replaces a group's entry in the defaults list only where there is one; `+`
        # appends it after the spec's own values (`_self_`), so the preset's win.
        choice = text.partition("=")[2] or "NAME"
        message = (
            f"the spec's defaults list has no {bare} entry to replace; to add one write "
            f"+{bare}={choice} (added last: its values win over the spec file's)"
        )
        return Problem(OVERRIDES, index, bare, message)
    parent, _, leaf = bare.rpartition(".")
    options = model_fields_at(parent.split(".") if parent else [])
    if leaf in options:  # a field the spec may have, under a section the file leaves out
        return Problem(OVERRIDES, index, bare, f"not in the spec; to add it write +{bare}=...")
    close = difflib.get_close_matches(leaf, options, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"to add a new key write +{bare}=..."
    return Problem(OVERRIDES, index, bare, f"unknown key; {hint}")


def composition_problem(err: Exception, source: SourceFile, provenance: Provenance) -> Problem:
    message = first_line(err)
    message = (
        message.replace(f"In '{message.split(chr(39))[1]}': ", "")
        if message.startswith("In '")
        else message
    )
    missing = message.split("'")[1] if message.startswith("Could not find '") else ""
    message = _missing_preset(message, [source.path.resolve().parent, *preset_roots()])
    for key, text, index in provenance.overrides:
        if text in str(err) or f"'{key}'" in str(err):
            if "not in struct" in str(err) or "Could not override" in message:
                return unknown_key_problem(key, index, text)
            return Problem(OVERRIDES, index, key.lstrip("+~"), message)
    full_key = getattr(err, "full_key", None)
    if full_key:
        return provenance.problem(str(full_key), message)
    if missing or "defaults" in message.lower():
        line, key = source.line_of("defaults") or 1, "defaults"
        for index, item in enumerate(source.data.get("defaults") or []):
            group, choice = (
                next(iter(item.items())) if isinstance(item, dict) and item else ("", "")
            )
            if f"{group}/{choice}" == missing:
                line, key = source.lines.get(f"defaults.{index}", line), f"defaults.{index}"
        return Problem(str(source.path), line, key, message)
    return Problem(str(source.path), 1, "", message)


def _missing_preset(message: str, roots: list[Path]) -> str:
    """Hydra's "Could not find 'algos/mapo'" as a sentence with the presets there are."""
    if not message.startswith("Could not find '"):
        return message
    group, _, choice = message.split("'")[1].partition("/")
    names = sorted({p.stem for root in roots for p in (root / group).glob("*.yaml")})
    if group not in PRESET_GROUPS or not names:
        return message
    import difflib

    close = difflib.get_close_matches(choice, names, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"no preset '{choice}' in {group}/{hint} ({group}: {', '.join(names)})"


_PYDANTIC_LOC = re.compile(r"^(function-\w+\[.*\]|range|choices)$")
# The member a plain union names in an error's path: model.sharing.literal[...] -> model.sharing
_UNION_MEMBER = re.compile(
    r"^(literal\[.*\]|dict\[.*\]|list\[.*\]|str|int|float|bool|schedule-points|schedule-linear)$"
)


def schema_problems(err, data: dict[str, Any], provenance: Provenance) -> list[Problem]:
    from marlctl.algos import registered_algos

    problems: list[Problem] = []
    seen: set[str] = set()
    algos = registered_algos()
    for item in err.errors(include_url=False):
        loc = [str(p) for p in item["loc"]]
        # A discriminated union puts its tag in the path: algo.mappo.lr -> algo.lr (also a
        # group's own: groups.adversary.algo.maddpg.lr -> groups.adversary.algo.lr)
        at = _algo_at(loc)
        tag = (
            loc.pop(at + 1)
            if at is not None and len(loc) > at + 1 and loc[at + 1] in algos
            else None
        )
        algo_data = _algo_data(data, loc[:at] if at is not None else [])
        if loc[:2] == ["sweep", "space"]:
            loc = [p for p in loc if not _PYDANTIC_LOC.match(p)]
        loc = [p for p in loc if not _UNION_MEMBER.match(p)]
        dotted = ".".join(loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            parent = loc[:-1] + ([tag] if tag else [])
            options = model_fields_at(parent)
            close = difflib.get_close_matches(loc[-1], options, n=1, cutoff=0.6)
            message = "unknown key" + (
                f"; did you mean '{close[0]}'?"
                if close
                else f"; valid keys: {', '.join(options)}"
                if options
                else ""
            )
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            given = algo_data.get("name") if isinstance(algo_data, dict) else None
            dotted = ".".join([*loc[: (at or 0) + 1], "name"]) if at is not None else "algo.name"
            close = difflib.get_close_matches(str(given), list(algos), n=1, cutoff=0.5)
            message = (f"unknown algorithm '{given}'" if given is not None else "required") + (
                f"; did you mean '{close[0]}'?" if close else f"; choose from {', '.join(algos)}"
            )
        elif kind == "missing":
            message = "required"
        elif loc == ["algo"] and isinstance(data.get("algo"), str):
            message = (
                f"must be a mapping with a name; to use the preset '{data['algo']}' "
                f"write algos={data['algo']} (or `- algos: {data['algo']}` in defaults)"
            )
        elif at is not None and loc[at:] == ["algo"] and isinstance(algo_data, str):
            message = f"must be a mapping with a name, such as {{name: {algo_data}}}"
        elif kind in ("int_parsing", "float_parsing") and item.get("input") in ("true", "false"):
            message = f"must be a number, not {item['input']}"  # see marlctl.strict
        else:
            message = item["msg"].removeprefix("Value error, ")
            given = item.get("input")
            quoted = isinstance(given, str) and f"'{given}'" in message
            if "input" in item and kind not in ("model_type", "dict_type") and not quoted:
                message += f" (got {given!r})"
        if dotted in seen:
            continue  # one problem per key: a union reports each member's complaint
        seen.add(dotted)
        problems.append(provenance.problem(dotted, message))
    return problems


def _algo_at(loc: list[str]) -> int | None:
    """Where an algorithm config sits in an error's path: `algo`, or a group's own."""
    if loc[:1] == ["algo"]:
        return 0
    if len(loc) >= 3 and loc[0] == "groups" and loc[2] == "algo":
        return 2
    return None


def _algo_data(data: dict[str, Any], parents: list[str]) -> Any:
    node: Any = data
    for part in [*parents, "algo"]:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def env_problem(
    env_id: str, err: Exception, provenance: Provenance, params: dict | None = None
) -> Problem:
    """What building, resetting or stepping the env once raised, placed on the spec."""
    from marlctl.callables import UserCodeError
    from marlctl.envs.probe import ProbeTimeout, UnsupportedSpace
    from marlctl.envs.registry import EnvLookupError, module_path_hint

    if isinstance(err, EnvLookupError):
        near = [Path.cwd(), provenance.spec.path.parent]
        hint = module_path_hint(err.module, near) if err.module else ""
        return provenance.problem("env.id", f"{err}{hint}")
    if isinstance(err, UnsupportedSpace):  # the env's own spaces: no params change them
        return provenance.problem("env.id", f"env '{env_id}': {err}")
    if isinstance(err, UserCodeError):
        return provenance.problem("env", f"building env '{env_id}' failed: {err}")
    if isinstance(err, ProbeTimeout):
        return provenance.problem("env.params", f"{err}; are the params out of proportion?")
    if isinstance(err, TypeError):
        unknown = _UNEXPECTED_KEYWORD.search(str(err))
        if unknown and unknown[1] in (params or {}):
            return provenance.problem(
                f"env.params.{unknown[1]}", _unknown_env_param(env_id, unknown[1])
            )
        return provenance.problem("env.params", f"env '{env_id}' rejected its params: {err}")
    # A message that starts with the name of a param the spec sets is about that param.
    first = str(err).split(" ", 1)[0]
    if isinstance(err, ValueError) and first in (params or {}):
        return provenance.problem(f"env.params.{first}", str(err))
    # The user's factory may raise anything; report it, never a traceback.
    message = f"building env '{env_id}' failed: {type(err).__name__}: {err}"
    return provenance.problem("env", message)


_UNEXPECTED_KEYWORD = re.compile(r"got an unexpected keyword argument '(\w+)'")


def _unknown_env_param(env_id: str, name: str) -> str:
    """A param the env does not take, with the one it likely means or those it takes."""
    from marlctl.envs.registry import env_params

    try:
        taken = [k for k in env_params(env_id).defaults if k != "render_mode"]
    except Exception:  # a factory whose parameters cannot be read: say what is known
        taken = []
    close = difflib.get_close_matches(name, taken, n=1, cutoff=0.6)
    hint = (
        f"; did you mean '{close[0]}'?"
        if close
        else f"; its parameters: {', '.join(taken)}"
        if taken
        else ""
    )
    return f"not a parameter of env '{env_id}'{hint}"
