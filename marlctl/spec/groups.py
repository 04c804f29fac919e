"""The spec's `groups:` section: who plays each agent group, and the pools of snapshots
that play a learning group in some episodes."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from marlctl.algos import registered_algos
from marlctl.callables import standard_library_refusal
from marlctl.spec.sections import CALLABLE, RANDOM_PLAYER, ModelSpec
from marlctl.strict import Strict


def _algo_union() -> Any:
    configs = tuple(info.config for info in registered_algos().values())
    return Annotated[Union[configs], Field(discriminator="name")]  # noqa: UP007


AlgoUnion = _algo_union()


def check_run_ref(key: str, ref: str) -> None:
    """ValueError unless `ref` reads RUN_ID[:CHECKPOINT]."""
    run_id, _, checkpoint = ref.partition(":")
    if not re.fullmatch(r"[0-9a-f]{4,32}", run_id):
        raise ValueError(
            f"{key}: '{ref}' must be RUN_ID[:CHECKPOINT], RUN_ID being a run id or the start "
            "of one (4 to 32 hexadecimal digits)"
        )
    if ":" in ref and not checkpoint.strip():
        raise ValueError(f"{key}: '{ref}' names no checkpoint after ':'")


def run_ref(ref: str) -> tuple[str, str | None]:
    """(run id or prefix, checkpoint or None) of RUN_ID[:CHECKPOINT]."""
    run_id, _, checkpoint = ref.partition(":")
    return run_id, checkpoint or None


class PoolSpec(Strict):
    """Past snapshots of a learning group's policy that play the group in a share of the
    episodes: self-play (a symmetric game's one group against its own past) and population
    training (the other groups learn against a pool, not one co-learner)."""

    size: int = Field(
        8, ge=1, le=64, description="Snapshots kept; the oldest leaves when a new one comes."
    )
    every: int = Field(
        100_000,
        ge=1,
        description="Env steps (per seed) between snapshots of the group's policy; the first "
        "is taken when training starts (the untrained policy).",
    )
    share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="The share of episodes a snapshot plays, drawn in each env as its episode "
        "starts; the learner plays the rest.",
    )
    sample: Literal["latest", "uniform", "prioritised"] = Field(
        "uniform",
        description="Which snapshot plays an episode: latest = the newest; uniform = any kept "
        "one; prioritised = weight (1 - x)^power, x being the learners' win rate against it "
        "(prioritised fictitious self-play, AlphaStar's PFSP).",
    )
    power: float = Field(
        2.0,
        ge=0.0,
        le=16.0,
        description="prioritised: the exponent of (1 - x); 0 = uniform, larger = the "
        "snapshots the learners beat least are drawn more.",
    )
    seats: Literal["all", "one"] = Field(
        "all",
        description="all = a snapshot plays every agent of the group; one = it plays one of "
        "them, drawn per episode, and the learner the others (self-play in a symmetric game, "
        "whose one group holds every seat).",
    )
    include: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="RUN_ID[:CHECKPOINT] of finished seed runs whose policy for this group "
        "joins the pool for the whole run beside the snapshots, never evicted or updated, "
        "drawn like them (latest: the newest snapshot and these): a league of policies "
        "trained elsewhere, as PSRO's and AlphaStar's populations. Each run trained this "
        "group on the same env, with the same agents and spaces; CHECKPOINT as in `frozen`.",
    )

    @field_validator("include")
    @classmethod
    def _run_refs(cls, value: list[str]) -> list[str]:
        for ref in value:
            check_run_ref("include", ref)
        if len(set(value)) < len(value):
            raise ValueError("names a run twice")
        return value


class GroupSpec(Strict):
    """Who plays an agent group. Neither field set: the group learns with `algo` and `model`."""

    scripted: str | None = Field(
        None,
        description="random = uniformly random allowed actions (uniform over the action box "
        "for continuous actions); package.module:callable = a policy you name, imported like "
        "an env factory and called as fn(obs, mask, group) with the group's observations "
        "[envs, agents, ...], action mask (or None) and GroupInfo; it returns the actions "
        "[envs, agents] (discrete) or [envs, agents, dim] (continuous, in the env's bounds).",
    )
    algo: AlgoUnion | None = Field(  # type: ignore[valid-type]
        None,
        description="This group learns with its own algorithm (any registered one, its "
        "fields as under the top-level `algo`), in a team of its own beside the other "
        "learning groups; null = the top-level `algo`.",
    )
    model: ModelSpec | None = Field(
        None,
        description="This group's networks (fields as under the top-level `model`; those "
        "left null take its algorithm's reference values); null = the top-level `model`.",
    )
    frozen: str | None = Field(
        None,
        description="RUN_ID[:CHECKPOINT]: this group's trained policy from a finished seed run "
        "of the tracking store, never updated; CHECKPOINT = latest (the last checkpoint) or "
        "an artifact path of the run; without it, its final policy. It acts as in its own run: "
        "sampling while this run trains, deterministically in evaluations.",
    )
    pool: PoolSpec | None = Field(
        None,
        description="Past snapshots of this learning group's policy play it in a share of "
        "the episodes (self-play, population training); its agents learn only from the "
        "episodes they play themselves. Evaluations play the learners against each other.",
    )

    @field_validator("scripted")
    @classmethod
    def _not_standard_library(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            refusal = standard_library_refusal(value, "scripted policy")
            if refusal is not None:
                raise ValueError(refusal)
        return value

    @model_validator(mode="after")
    def _one_player(self) -> GroupSpec:
        if self.scripted is not None and self.frozen is not None:
            raise ValueError("a group is scripted or frozen, not both")
        if not self.learns and (self.algo is not None or self.model is not None):
            raise ValueError("a scripted or frozen group does not learn: it takes no algo or model")
        if self.scripted is not None and self.scripted != RANDOM_PLAYER:
            if not CALLABLE.match(self.scripted):
                raise ValueError(
                    f"scripted: '{self.scripted}' must be random or package.module:callable"
                )
        if self.frozen is not None:
            check_run_ref("frozen", self.frozen)
        if not self.learns and self.pool is not None:
            raise ValueError("a scripted or frozen group does not learn: it keeps no pool")
        return self

    @property
    def learns(self) -> bool:
        return self.scripted is None and self.frozen is None

    @property
    def own_team(self) -> bool:
        """Learns with an algorithm or model of its own."""
        return self.learns and (self.algo is not None or self.model is not None)

    @property
    def frozen_run(self) -> tuple[str, str | None]:
        """(run id or prefix, checkpoint or None) of a frozen group."""
        return run_ref(self.frozen or "")
