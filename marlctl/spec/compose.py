"""Spec file + Hydra overrides → validated `Spec`, with every problem located in its source.

Composition uses Hydra's compose API: the spec (YAML or TOML) is the primary config, its
`defaults:` list pulls presets from `algos/`, `envs/`, `models/`, `sweeps/` (a preset file
places itself with `# @package algo`), and overrides use Hydra's grammar. Pure: no torch, no
mlflow.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.spec.checks import probe_problems
from marlctl.spec.env_params import (
    drop_foreign_env_params,
    refuse_untrusted_factory,
    replace_env_params,
)
from marlctl.spec.models import Spec
from marlctl.spec.problems import (
    NO_HYDRA,
    PRESET_NAME,
    composition_problem,
    first_line,
    not_a_preset,
    schema_problems,
    unknown_key_problem,
    unparsed,
)
from marlctl.spec.provenance import (
    OVERRIDES,
    PRESET_GROUPS,
    LoadedSpec,
    Provenance,
    preset_roots,
    sort_problems,
)
from marlctl.spec.source import MAX_DEPTH, SourceFile, load_source


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
            refuse_untrusted_factory(source, stored)
        provenance = Provenance(source)
        composed, provenance = _compose(source, list(overrides), provenance)
        replace_env_params(composed, provenance)
        notes = drop_foreign_env_params(composed, provenance)
        spec = _validate(composed, provenance)
    except SpecError as err:
        if stored is None:
            raise
        shown = str(spec_path)
        raise SpecError(
            [replace(p, file=stored) if p.file == shown else p for p in err.problems]
        ) from None
    return LoadedSpec(spec, spec.model_dump(mode="json"), provenance, notes)


_store_counter = itertools.count()


def _compose(source: SourceFile, overrides: list[str], provenance: Provenance):
    """The spec composed with its presets and the overrides that apply; the problems of
    those that do not are kept in `provenance.failed`, reported with the schema's."""
    from omegaconf import OmegaConf

    problems = _parse_overrides(overrides, provenance)
    # Overrides that do not parse are reported with whatever else is wrong; the rest apply.
    active = [text for _, text, _ in provenance.overrides]
    data, defaults = _checked_defaults(source, provenance, problems)
    composer = _Composer(source, provenance)
    errors = composer.errors
    try:
        # Pass 1 finds the algorithm; pass 2 composes over a base of the spec's defaults so
        # that plain overrides such as `algo.lr=3e-4` reach keys the file leaves out.
        first = composer.run(data, composer.group_overrides)
    except errors as err:
        problems.append(composition_problem(err, source, provenance))
        raise SpecError(sort_problems(problems)) from None
    algo_name = OmegaConf.select(first, "algo.name", default=None)
    for key, text, _ in provenance.overrides:
        if key.lstrip("+") == "algo.name":
            algo_name = text.split("=", 1)[1]
    skeleton = _defaults_skeleton(algo_name)
    problems += _unknown_keys(skeleton, first, provenance, active)
    composed, choices = composer.run_over(skeleton, data, defaults, active, overrides, problems)
    provenance.presets += _preset_sources(choices, composer.roots)
    assert isinstance(composed, dict)
    composed.pop("defaults", None)
    provenance.failed = problems
    return composed, provenance


def _parse_overrides(overrides: list[str], provenance: Provenance) -> list[Problem]:
    """Note every override that parses in `provenance`; the problems of the others."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    problems: list[Problem] = []
    parser = OverridesParser.create()
    for index, text in enumerate(overrides, start=1):
        try:
            parsed = parser.parse_override(text)
            too_deep = _nested_too_deep(parsed.value())
        except HydraException as err:
            problems.append(Problem(OVERRIDES, index, text, unparsed(text, first_line(err))))
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
            problems.append(Problem(OVERRIDES, index, text, NO_HYDRA))
            continue
        parent, _, last = parsed.key_or_group.rpartition(".")
        if parsed.is_delete() and parent and last.isdigit():  # Hydra deletes no list element
            message = f"an element of a list cannot be deleted: set the whole list ({parent}=[...])"
            problems.append(Problem(OVERRIDES, index, text, message))
            continue
        provenance.overrides.append((parsed.key_or_group, text, index))
    return problems


def _checked_defaults(
    source: SourceFile, provenance: Provenance, problems: list[Problem]
) -> tuple[dict[str, Any], list[Any]]:
    """(the file's data without Hydra's settings, its defaults list); SpecError with every
    problem so far when the defaults or the presets chosen are not names of presets."""
    shown = str(source.path)
    data = dict(source.data)
    if "hydra" in data:
        problems.append(Problem(shown, source.line_of("hydra"), "hydra", NO_HYDRA))
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
            if not PRESET_NAME.match(str(choice)):
                line = source.line_of(f"defaults.{position}")
                problems.append(Problem(shown, line, f"defaults.{group}", not_a_preset(choice)))
    for key, text, index in provenance.overrides:
        choice = text.split("=", 1)[1] if "=" in text else ""
        if key.lstrip("+~").split("@")[0] in PRESET_GROUPS and not PRESET_NAME.match(choice):
            problems.append(Problem(OVERRIDES, index, text, not_a_preset(choice)))
    if problems:
        raise SpecError(sort_problems(problems))
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]  # the file's own values win over its presets
    data["defaults"] = defaults
    return data, defaults


def _unknown_keys(
    skeleton: dict[str, Any], first: Any, provenance: Provenance, active: list[str]
) -> list[Problem]:
    """The plain overrides that set keys the spec does not have, taken out of `active`.

    Unknown keys are found here all at once: Hydra stops at the first, and composing again
    for each of a thousand bad overrides would take minutes."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    plain = [o for o in provenance.overrides if o[1].lstrip()[:1] not in "+~"]
    try:
        # Only for plain overrides: merging copies the whole spec, seconds for a huge one.
        known = OmegaConf.merge(OmegaConf.create(skeleton), first) if plain else None
    except OmegaConfBaseException:  # e.g. a list where a mapping belongs: reported below
        known = None
    problems = []
    for key, text, index in plain if known is not None else ():
        if _unknown_key(known, key) and text in active:
            active.remove(text)
            problems.append(unknown_key_problem(key, index))
    return problems


class _Composer:
    """Hydra's compose over the spec's folder and the preset folders, a node at a time."""

    def __init__(self, source: SourceFile, provenance: Provenance):
        from hydra.core.config_store import ConfigStore
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        self.source, self.provenance = source, provenance
        self.store = ConfigStore.instance()
        self.roots = [source.path.resolve().parent, *preset_roots()]
        self.search = ",".join(f"'file://{r}'" for r in self.roots[1:])
        self.group_overrides = [
            text
            for key, text, _ in provenance.overrides
            if key.lstrip("+~").split("@")[0] in PRESET_GROUPS
        ]
        self.errors = (HydraException, OmegaConfBaseException, ValueError)

    def run(self, node: dict, chosen: list[str]):
        from hydra import compose, initialize_config_dir

        name = f"marlctl_spec_{next(_store_counter)}"
        self.store.store(name=name, node=node)
        try:
            with initialize_config_dir(version_base=None, config_dir=str(self.roots[0])):
                return compose(
                    name,
                    overrides=[f"hydra.searchpath=[{self.search}]", *chosen],
                    return_hydra_config=True,
                )
        finally:  # a stored node stays for the process: each would slow every later compose
            self.store.repo.pop(f"{name}.yaml", None)

    def run_over(self, skeleton, data, defaults, active, overrides, problems):
        """(the composed spec, the presets chosen) over a base of `skeleton`. Hydra stops at
        the first override it cannot apply: drop it and go on, so every bad override is
        reported at once."""
        base = f"marlctl_base_{next(_store_counter)}"
        self.store.store(name=base, node=skeleton)
        retries = 0
        try:
            while True:
                try:
                    return self._applied(base, data, defaults, active, problems)
                except self.errors as err:
                    problem = composition_problem(err, self.source, self.provenance)
                    problems.append(problem)
                    culprit = overrides[problem.line - 1] if problem.file == OVERRIDES else None
                    if culprit not in active:  # e.g. overrides interpolating each other in a cycle
                        raise SpecError(sort_problems(problems)) from None
                    active.remove(culprit)
                    retries += 1
                    if retries >= MAX_RETRIES:
                        message = f"stopped after {MAX_RETRIES} overrides that do not apply"
                        problems.append(Problem(OVERRIDES, None, "", message))
                        raise SpecError(sort_problems(problems)) from None
        finally:
            self.store.repo.pop(f"{base}.yaml", None)

    def _applied(self, base, data, defaults, active, problems):
        from omegaconf import OmegaConf

        applied = [_replacing_params(text, key) for key, text in _keyed(active, self.provenance)]
        cfg = self.run({**data, "defaults": [base, *defaults]}, applied)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        resolvers = _resolver_calls(OmegaConf.to_container(cfg, resolve=False))
        if resolvers:
            message = (
                "resolvers such as ${oc.env:...} are not allowed: a spec reads "
                "nothing from the environment (interpolate other keys as ${key.path})"
            )
            problems.extend(self.provenance.problem(path, message) for path in resolvers)
            raise SpecError(sort_problems(problems))
        return OmegaConf.to_container(cfg, resolve=True), choices


def _preset_sources(choices: Any, roots: list[Path]) -> list[SourceFile]:
    """The preset files composition chose, read for their line numbers."""
    found = []
    for group, choice in (choices or {}).items():
        if group.startswith("hydra") or choice is None:
            continue
        for root in roots:
            for suffix in (".yaml", ".yml"):
                candidate = root / group / f"{choice}{suffix}"
                if candidate.is_file():
                    found.append(load_source(candidate))
                    break
            else:
                continue
            break
    return found


def _keyed(active: list[str], provenance: Provenance) -> list[tuple[str, str]]:
    keys = {text: key for key, text, _ in provenance.overrides}
    return [(keys[text], text) for text in active]


def _replacing_params(text: str, key: str) -> str:
    """`env.params={...}` (or `env={params: {...}}`) as Hydra applies it whatever the spec's
    file holds: params the file or its preset lacks are the env factory's open set of
    keywords, not unknown keys of a schema (`replace_env_params` then keeps the given keys
    only; the schema still checks every other key)."""
    if key not in ("env", "env.params") or "=" not in text:  # `~env.params`: a deletion
        return text
    value = text.split("=", 1)[1].lstrip()
    return f"++{text}" if value.startswith("{") else text


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


def _validate(data: dict[str, Any], provenance: Provenance) -> Spec:
    from pydantic import ValidationError

    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        problems = [*provenance.failed, *schema_problems(err, data, provenance)]
        if not any(p.path.startswith("env") for p in problems):
            problems += probe_problems(data, provenance)
        raise SpecError(sort_problems(problems)) from None
    if provenance.failed:
        raise SpecError(sort_problems(provenance.failed))
    return spec
