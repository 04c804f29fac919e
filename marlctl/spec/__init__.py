"""Spec file + Hydra overrides → validated `Spec`, with every problem located in its source.

Composition uses Hydra's compose API: the spec (YAML or TOML) is the primary config, its
`defaults:` list pulls presets from `algos/`, `envs/`, `sweeps/` (a preset file places itself
with `# @package algo`), and overrides use Hydra's grammar. Pure: no torch, no mlflow.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.spec.models import Spec, model_fields_at
from marlctl.spec.source import MAX_DEPTH, SourceFile, load_source

PRESET_GROUPS = ("algos", "envs", "sweeps")
OVERRIDES = "<overrides>"


@dataclass
class Provenance:
    """Where each value came from, to place an error on the right file and line."""

    spec: SourceFile
    presets: list[SourceFile] = field(default_factory=list)
    overrides: list[tuple[str, str, int]] = field(default_factory=list)  # key, text, position
    failed: list[Problem] = field(default_factory=list)  # overrides that could not apply

    def locate(self, dotted: str) -> tuple[str, int | None]:
        for key, _, position in reversed(self.overrides):
            if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
                return OVERRIDES, position
        if self.spec.defines(dotted):
            return str(self.spec.path), self.spec.line_of(dotted)
        for preset in self.presets:
            if preset.defines(dotted):
                return str(preset.path), preset.line_of(dotted)
        return str(self.spec.path), self.spec.line_of(dotted) or 1

    def problem(self, dotted: str, message: str) -> Problem:
        file, line = self.locate(dotted)
        return Problem(file, line, dotted, message)


@dataclass
class LoadedSpec:
    spec: Spec
    resolved: dict[str, Any]  # the composed, validated spec as plain data (defaults filled in)
    provenance: Provenance
    notes: list[str] = field(default_factory=list)  # what composition changed, one line each

    @property
    def experiment(self) -> str:
        return self.spec.name or self.provenance.spec.path.stem


def preset_roots() -> list[Path]:
    """Folders holding `algos/`, `envs/`, `sweeps/`: the working dir and the installed presets."""
    here = Path(__file__).resolve().parent.parent
    candidates = [Path.cwd(), here / "presets", here.parent]
    roots: list[Path] = []
    for root in candidates:
        if any((root / g).is_dir() for g in PRESET_GROUPS) and root.resolve() not in roots:
            roots.append(root.resolve())
    return roots


def load_spec(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), stored: str | None = None
) -> LoadedSpec:
    """Load, compose and validate; raise SpecError listing every problem found.

    `stored` names where the file came from when it was read from a tracking store (a run
    id): such a spec may not import an env factory this machine does not trust, and its
    problems name it, not the temporary file it was downloaded to.
    """
    spec_path = Path(path)
    try:
        source = load_source(spec_path)
        if stored is not None:
            _refuse_untrusted_factory(source, stored)
        provenance = Provenance(source)
        composed, provenance = _compose(source, list(overrides), provenance)
        _replace_env_params(composed, provenance)
        notes = _drop_foreign_env_params(composed, provenance)
        spec = _validate(composed, provenance)
    except SpecError as err:
        if stored is None:
            raise
        shown = str(spec_path)
        raise SpecError(
            [replace(p, file=stored) if p.file == shown else p for p in err.problems]
        ) from None
    return LoadedSpec(spec, spec.model_dump(mode="json"), provenance, notes)


# ---------------------------------------------------------------- env params across env ids


def _replace_env_params(composed: dict[str, Any], provenance: Provenance) -> None:
    """`env.params={...}` replaces the params instead of merging into them (Hydra merges a
    mapping override), so `env.params={}` clears what a preset set. Params set by later
    overrides (`env.params={} env.params.N=4`) stay."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    env = composed.get("env")
    params = env.get("params") if isinstance(env, dict) else None
    if not isinstance(params, dict):
        return
    parser = None
    keep: set[str] | None = None
    for key, text, _ in provenance.overrides:
        if key not in ("env", "env.params") and not key.startswith("env.params."):
            continue
        if key.startswith("env.params."):
            if keep is not None:
                keep.add(key.split(".")[2])
            continue
        parser = parser or OverridesParser.create()
        try:
            parsed = parser.parse_override(text)
            value = parsed.value()
        except HydraException:
            continue  # reported by composition
        if parsed.is_delete():
            continue
        if key == "env":
            value = value.get("params") if isinstance(value, dict) else None
        if isinstance(value, dict):
            keep = {str(k) for k in value}
    if keep is not None:
        env["params"] = {k: v for k, v in params.items() if k in keep}


# Where a value comes from, by how late the user chose it: a preset the spec's defaults
# pick, the spec file, a preset picked on the command line (`envs=NAME`), an override.
_FROM_PRESET, _FROM_FILE, _FROM_CHOSEN_PRESET, _FROM_OVERRIDE = range(4)


def _origin(dotted: str, provenance: Provenance) -> int:
    for key, _, _ in provenance.overrides:
        if key not in PRESET_GROUPS and (dotted == key or dotted.startswith(key + ".")):
            return _FROM_OVERRIDE
    if provenance.spec.defines(dotted):
        return _FROM_FILE
    chosen = any(key.split("@")[0] == "envs" for key, _, _ in provenance.overrides)
    return _FROM_CHOSEN_PRESET if chosen else _FROM_PRESET


def _drop_foreign_env_params(composed: dict[str, Any], provenance: Provenance) -> list[str]:
    """Drop the env params that were written for another env and that this one does not take.

    A param is written for another env when it was set before the env id was chosen: by
    the preset of `envs: simple_spread` when an override then says `env.id=mpe/simple_tag`,
    or by the spec file when `envs=NAME` picks the env on the command line. Params set with
    the id, or after it, are the user's for this env: a wrong one is still an error (the
    probe reports it). Params the factory takes through `**kwargs` count as taken.
    """
    env = composed.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        return []
    params = env.get("params")
    if not isinstance(params, dict) or not params:
        return []
    chosen_at = _origin("env.id", provenance)
    inherited = [k for k in params if _origin(f"env.params.{k}", provenance) < chosen_at]
    if not inherited:
        return []
    from marlctl.envs.registry import env_params

    try:
        accepted = env_params(env["id"])
    except Exception:  # an unknown id or a factory that does not import: the probe says so
        return []
    foreign = [k for k in inherited if not accepted.accepts(str(k))]
    if not foreign:
        return []
    env["params"] = {k: v for k, v in params.items() if k not in foreign}
    note = f"env.params: dropped {', '.join(map(str, foreign))}: not parameters of {env['id']}"
    preset = _env_preset(env["id"])
    if preset is not None and chosen_at != _FROM_CHOSEN_PRESET:
        note += f" (its own preset: envs={preset})"
    return [note]


def _env_preset(env_id: str) -> str | None:
    """The name of the env preset of a registered id, when one is found."""
    from marlctl.envs.registry import preset_name, registered_ids

    if env_id not in registered_ids():
        return None
    name = preset_name(env_id)
    found = any((root / "envs" / f"{name}.yaml").is_file() for root in preset_roots())
    return name if found else None


def _refuse_untrusted_factory(source: SourceFile, stored: str) -> None:
    from marlctl.envs.registry import TRUSTED_FACTORIES_VAR, untrusted_factory

    env = source.data.get("env")
    factory = untrusted_factory(env.get("id") if isinstance(env, dict) else None)
    if factory is not None:
        message = (
            f"the spec stored with {stored} names the env factory '{factory}': loading it "
            f"would run that code here. If you trust it, pass --trust-factory {factory} "
            f"(or list it in {TRUSTED_FACTORIES_VAR})"
        )
        raise SpecError([Problem(stored, None, "env.id", message)])
    trusted = {f.strip() for f in os.environ.get(TRUSTED_FACTORIES_VAR, "").split(",")}
    groups = source.data.get("groups")
    for name, group in (groups or {}).items() if isinstance(groups, dict) else ():
        policy = group.get("scripted") if isinstance(group, dict) else None
        if isinstance(policy, str) and ":" in policy and policy not in trusted:
            message = (
                f"the spec stored with {stored} names the scripted policy '{policy}': loading "
                f"it would run that code here. If you trust it, pass --trust-factory {policy} "
                f"(or list it in {TRUSTED_FACTORIES_VAR})"
            )
            raise SpecError([Problem(stored, None, f"groups.{name}.scripted", message)])


_store_counter = itertools.count()


def _compose(source: SourceFile, overrides: list[str], provenance: Provenance):
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    shown = str(source.path)
    problems: list[Problem] = []
    parser = OverridesParser.create()
    for index, text in enumerate(overrides, start=1):
        try:
            parsed = parser.parse_override(text)
            too_deep = _nested_too_deep(parsed.value())
        except HydraException as err:
            problems.append(Problem(OVERRIDES, index, text, _unparsed(text, _first_line(err))))
            continue
        except RecursionError:  # the parser recurses once per nesting level
            too_deep = True
        if too_deep:
            message = f"nested deeper than {MAX_DEPTH} levels"
            problems.append(Problem(OVERRIDES, index, text, message))
            continue
        if not parsed.key_or_group:
            problems.append(Problem(OVERRIDES, index, text, "bad override: the key is empty"))
            continue
        if parsed.key_or_group.split(".")[0] == "hydra":
            problems.append(Problem(OVERRIDES, index, text, _NO_HYDRA))
            continue
        provenance.overrides.append((parsed.key_or_group, text, index))
    # Overrides that do not parse are reported with whatever else is wrong; the rest apply.
    active = [text for _, text, _ in provenance.overrides]

    data = dict(source.data)
    if "hydra" in data:
        problems.append(Problem(shown, source.line_of("hydra"), "hydra", _NO_HYDRA))
        del data["hydra"]
    defaults = data.get("defaults", [])
    if not isinstance(defaults, list):
        raise SpecError(
            [
                Problem(
                    shown,
                    source.line_of("defaults"),
                    "defaults",
                    "must be a list such as [{algos: mappo}, _self_]",
                )
            ]
        )
    for position, entry in enumerate(defaults):
        for group, choice in entry.items() if isinstance(entry, dict) else ():
            if not _PRESET_NAME.match(str(choice)):
                line = source.line_of(f"defaults.{position}")
                problems.append(Problem(shown, line, f"defaults.{group}", _not_a_preset(choice)))
    for key, text, index in provenance.overrides:
        choice = text.split("=", 1)[1] if "=" in text else ""
        if key.lstrip("+~").split("@")[0] in PRESET_GROUPS and not _PRESET_NAME.match(choice):
            problems.append(Problem(OVERRIDES, index, text, _not_a_preset(choice)))
    if problems:
        raise SpecError(sort_problems(problems))
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]  # the file's own values win over its presets
    data["defaults"] = defaults
    store = ConfigStore.instance()
    roots = [source.path.resolve().parent, *preset_roots()]
    search = ",".join(f"'file://{r}'" for r in roots[1:])
    group_overrides = [
        text
        for key, text, _ in provenance.overrides
        if key.lstrip("+~").split("@")[0] in PRESET_GROUPS
    ]

    def run_compose(node: dict, chosen: list[str]):
        name = f"marlctl_spec_{next(_store_counter)}"
        store.store(name=name, node=node)
        try:
            with initialize_config_dir(version_base=None, config_dir=str(roots[0])):
                return compose(
                    name,
                    overrides=[f"hydra.searchpath=[{search}]", *chosen],
                    return_hydra_config=True,
                )
        finally:  # a stored node stays for the process: each would slow every later compose
            store.repo.pop(f"{name}.yaml", None)

    errors = (HydraException, OmegaConfBaseException, ValueError)
    try:
        # Pass 1 finds the algorithm; pass 2 composes over a base of the spec's defaults so
        # that plain overrides such as `algo.lr=3e-4` reach keys the file leaves out.
        first = run_compose(data, group_overrides)
    except errors as err:
        problems.append(_composition_problem(err, source, provenance))
        raise SpecError(sort_problems(problems)) from None
    algo_name = OmegaConf.select(first, "algo.name", default=None)
    for key, text, _ in provenance.overrides:
        if key.lstrip("+") == "algo.name":
            algo_name = text.split("=", 1)[1]
    skeleton = _defaults_skeleton(algo_name)
    # Unknown keys are found here all at once: Hydra stops at the first, and composing again
    # for each of a thousand bad overrides would take minutes.
    plain = [o for o in provenance.overrides if o[1].lstrip()[:1] not in "+~"]
    try:
        # Only for plain overrides: merging copies the whole spec, seconds for a huge one.
        known = OmegaConf.merge(OmegaConf.create(skeleton), first) if plain else None
    except OmegaConfBaseException:  # e.g. a list where a mapping belongs: reported below
        known = None
    for key, text, index in plain if known is not None else ():
        if _unknown_key(known, key) and text in active:
            active.remove(text)
            problems.append(_unknown_key_problem(key, index))
    base = f"marlctl_base_{next(_store_counter)}"
    store.store(name=base, node=skeleton)
    retries = 0
    try:
        while True:
            # Hydra stops at the first override it cannot apply: drop it and go on, so every
            # bad override is reported at once.
            try:
                applied = [_replacing_params(text, key) for key, text in _keyed(active, provenance)]
                cfg = run_compose({**data, "defaults": [base, *defaults]}, applied)
                choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
                OmegaConf.set_struct(cfg, False)
                del cfg["hydra"]
                resolvers = _resolver_calls(OmegaConf.to_container(cfg, resolve=False))
                if resolvers:
                    message = (
                        "resolvers such as ${oc.env:...} are not allowed: a spec reads "
                        "nothing from the environment (interpolate other keys as ${key.path})"
                    )
                    problems.extend(provenance.problem(path, message) for path in resolvers)
                    raise SpecError(sort_problems(problems))
                composed = OmegaConf.to_container(cfg, resolve=True)
                break
            except errors as err:
                problem = _composition_problem(err, source, provenance)
                problems.append(problem)
                culprit = overrides[problem.line - 1] if problem.file == OVERRIDES else None
                if culprit not in active:  # e.g. overrides that interpolate each other in a cycle
                    raise SpecError(sort_problems(problems)) from None
                active.remove(culprit)
                retries += 1
                if retries >= MAX_RETRIES:
                    message = f"stopped after {MAX_RETRIES} overrides that do not apply"
                    problems.append(Problem(OVERRIDES, None, "", message))
                    raise SpecError(sort_problems(problems)) from None
    finally:
        store.repo.pop(f"{base}.yaml", None)
    for group, choice in (choices or {}).items():
        if group.startswith("hydra") or choice is None:
            continue
        for root in roots:
            for suffix in (".yaml", ".yml"):
                candidate = root / group / f"{choice}{suffix}"
                if candidate.is_file():
                    provenance.presets.append(load_source(candidate))
                    break
            else:
                continue
            break
    assert isinstance(composed, dict)
    composed.pop("defaults", None)
    provenance.failed = problems
    return composed, provenance


def _keyed(active: list[str], provenance: Provenance) -> list[tuple[str, str]]:
    keys = {text: key for key, text, _ in provenance.overrides}
    return [(keys[text], text) for text in active]


def _replacing_params(text: str, key: str) -> str:
    """`env.params={...}` (or `env={params: {...}}`) as Hydra applies it whatever the spec's
    file holds: params the file or its preset lacks are the env factory's open set of
    keywords, not unknown keys of a schema (`_replace_env_params` then keeps the given keys
    only; the schema still checks every other key)."""
    if key not in ("env", "env.params"):
        return text
    value = text.split("=", 1)[1].lstrip()
    return f"++{text}" if value.startswith("{") else text


_ANTLR_INPUT = re.compile(r"^(?:extraneous|mismatched) input '(.*)' expecting")
_ANTLR_UNREAD = re.compile(
    r"^(?:no viable alternative at input|token recognition error at:) '(.*)'$"
)


def _nested_too_deep(value: Any) -> bool:
    """Whether an override's value nests deeper than a spec file may (its key's own levels
    are few: a key path is one word of the grammar)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _unparsed(text: str, error: str) -> str:
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


_PRESET_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


def _not_a_preset(choice: Any) -> str:
    return f"'{choice}' is not a preset name (letters, digits, _ and -; no paths)"


_NO_HYDRA = "Hydra's own settings do not apply: marlctl composes specs, it runs no Hydra app"
_RESOLVER = re.compile(r"\$\{\s*[\w.\-]+\s*:")


def _resolver_calls(data: Any, prefix: str = "") -> list[str]:
    """Key paths whose value calls an OmegaConf resolver (`${oc.env:HOME}`)."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return []
    found: list[str] = []
    for key, value in items:
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, str) and _RESOLVER.search(value):
            found.append(path)
        else:
            found.extend(_resolver_calls(value, path))
    return found


def _defaults_skeleton(algo_name: Any) -> dict[str, Any]:
    from marlctl.algos import registered_algos
    from marlctl.spec.models import HardwareSpec, ModelSpec, TrackingSpec, TrainSpec

    skeleton: dict[str, Any] = {
        "name": None,
        "label": None,
        "seeds": [0],
        "model": ModelSpec().model_dump(),
        "train": TrainSpec().model_dump(),
        "hardware": HardwareSpec().model_dump(),
        "tracking": TrackingSpec().model_dump(),
        "env": {"backend": "pettingzoo", "params": {}, "reward_weights": None},
    }
    info = registered_algos().get(str(algo_name))
    if info is not None:
        skeleton["algo"] = info.config().model_dump()
    return skeleton


def _first_line(err: Exception) -> str:
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


MAX_RETRIES = 10  # compositions repeated to find overrides that do not apply, beyond unknown keys


def _unknown_key(known: Any, key: str) -> bool:
    """Whether an override `key=...` names a mapping key that does not exist (keys under
    lists and preset groups are left to Hydra)."""
    from omegaconf import DictConfig

    if key.split("@")[0] in PRESET_GROUPS or "[" in key:
        return False
    node, parts = known, key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return isinstance(node, DictConfig) and parts[-1] not in node


def _unknown_key_problem(key: str, index: int, text: str = "") -> Problem:
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


def _composition_problem(err: Exception, source: SourceFile, provenance: Provenance) -> Problem:
    message = _first_line(err)
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
                return _unknown_key_problem(key, index, text)
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


def _validate(data: dict[str, Any], provenance: Provenance) -> Spec:
    from pydantic import ValidationError

    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        problems = [*provenance.failed, *_schema_problems(err, data, provenance)]
        if not any(p.path.startswith("env") for p in problems):
            problems += _env_problems(data, provenance)
        raise SpecError(sort_problems(problems)) from None
    if provenance.failed:
        raise SpecError(sort_problems(provenance.failed))
    return spec


_PYDANTIC_LOC = re.compile(r"^(function-\w+\[.*\]|range|choices)$")
# The member a plain union names in an error's path: model.sharing.literal[...] -> model.sharing
_UNION_MEMBER = re.compile(r"^(literal\[.*\]|dict\[.*\]|list\[.*\]|str|int|float|bool)$")


def _schema_problems(err, data: dict[str, Any], provenance: Provenance) -> list[Problem]:
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


def _env_problems(data: dict[str, Any], provenance: Provenance) -> list[Problem]:
    """Probe the env even when other keys are invalid, so its problems are listed too."""
    env = data.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        return []
    params = env.get("params", {})
    if not isinstance(params, dict):
        return []
    problem = native_params_problem(env["id"], env.get("backend"), params, provenance)
    if problem is not None:
        return [problem]
    from marlctl.envs.registry import probe

    try:
        probe(env["id"], params)
    except Exception as err:
        return [env_problem(env["id"], err, provenance, params)]
    return []


def native_params_problem(
    env_id: str, backend: Any, params: dict[str, Any], provenance: Provenance
) -> Problem | None:
    """What keeps a native env from running with `params`, found before the env is probed:
    an `lbf/` task is probed through its package, which takes values the native env cannot
    (and fails on some with the package's own words)."""
    from marlctl.envs.native import is_native, native_problem

    if backend != "native" or not is_native(env_id):
        return None
    problem = native_problem(env_id, params)
    return None if problem is None else provenance.problem(*problem)


def env_problem(
    env_id: str, err: Exception, provenance: Provenance, params: dict | None = None
) -> Problem:
    """What building, resetting or stepping the env once raised, placed on the spec."""
    from marlctl.callables import UserCodeError
    from marlctl.envs.registry import (
        EnvLookupError,
        ProbeTimeout,
        UnsupportedSpace,
        module_path_hint,
    )

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


def tracking_problem(loaded: LoadedSpec) -> Problem | None:
    """An http(s) `tracking.uri` where no server answers, at its line: found in about two
    seconds here, where MLflow would retry it for long after the runs started."""
    from marlctl.redact import redact
    from marlctl.servers import server_silence

    uri = loaded.spec.tracking.uri
    if uri is None or uri.split("://", 1)[0].lower() not in ("http", "https"):
        return None
    reason = server_silence(uri)
    if reason is None:
        return None
    message = f"no MLflow server answers at {redact(uri)} ({reason})"
    return loaded.provenance.problem("tracking.uri", message)


def sort_problems(problems: list[Problem]) -> list[Problem]:
    """The spec file's problems first, by line; then presets; command-line overrides last."""
    return sorted(problems, key=lambda p: (p.file == OVERRIDES, p.file, p.line or 0))
