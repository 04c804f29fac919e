"""Env params across env ids: what an `env.params={...}` override replaces, the params a
preset wrote for another env, and the env factories a stored spec may name."""

from __future__ import annotations

import os
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.spec.provenance import PRESET_GROUPS, Provenance, preset_roots
from marlctl.spec.source import SourceFile


def replace_env_params(composed: dict[str, Any], provenance: Provenance) -> None:
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


def drop_foreign_env_params(composed: dict[str, Any], provenance: Provenance) -> list[str]:
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


def refuse_untrusted_factory(source: SourceFile, stored: str) -> None:
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
