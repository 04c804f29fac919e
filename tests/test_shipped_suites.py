"""What the shipped regression-baseline suites compare: a variant cell is its base cell with only
the variant's values changed, SMAX's cells carry JaxMARL's SMAX settings where an algorithm has
the field, and VMAS het_mass rewards what its cells are judged on."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from marlctl.envs.registry import lookup
from marlctl.reproduce.runner import plan_suite

SUITES = Path(__file__).resolve().parent.parent / "suites"


def flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def cell_specs(suite: str, cells: list[str]) -> dict[str, dict[str, object]]:
    """Each named cell's composed spec (its file and overrides, validated), flattened."""
    planned = plan_suite(str(SUITES / f"{suite}.yaml"), [], cells=",".join(cells), seeds=2)
    return {cp.name: flat(cp.loaded.spec.model_dump(mode="json")) for cp in planned}


def differences(a: dict[str, object], b: dict[str, object]) -> dict[str, tuple]:
    """The fields two specs set differently, but for `name` (each cell's experiment)."""
    keys = (a.keys() | b.keys()) - {"name"}
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


VARIANTS = [
    # suite, variant cell, base cell, the fields the variant changes
    ("baseline-mpe", "a2c-lr4e-3-simple_spread", "a2c-simple_spread", {"algo.lr"}),
    ("baseline-mpe", "ia2c-lr4e-3-simple_spread", "ia2c-simple_spread", {"algo.lr"}),
    ("baseline-mpe", "ia2c-simple_spread", "a2c-simple_spread", {"algo.name"}),
    ("baseline-mpe", "masac-n20-simple_speaker_listener", "masac-simple_speaker_listener",
     {"algo.n_step"}),
    ("baseline-mpe", "masac-current-simple_speaker_listener", "masac-simple_speaker_listener",
     {"algo.actor_joint_action"}),
    ("baseline-vmas-het", "mappo-independent-het_mass", "mappo-het_mass", {"model.sharing"}),
    ("baseline-vmas-het", "masac-current-independent-het_mass", "masac-current-het_mass",
     {"model.sharing"}),
]  # fmt: skip


@pytest.mark.parametrize(("suite", "variant", "base", "changed"), VARIANTS,
                         ids=[v[1] for v in VARIANTS])  # fmt: skip
def test_a_variant_cell_is_its_base_with_only_the_variant_s_values_changed(
    suite: str, variant: str, base: str, changed: set[str]
) -> None:
    specs = cell_specs(suite, [variant, base])
    assert set(differences(specs[variant], specs[base])) == changed


def test_smax_cells_carry_jaxmarl_s_settings_where_the_algorithm_has_the_field() -> None:
    specs = cell_specs("baseline-smax", ["mappo-2s3z", "mappo-3m", "ippo-3m", "masac-3m"])
    for name in ("mappo-2s3z", "mappo-3m", "ippo-3m"):
        spec = specs[name]
        assert spec["algo.rollout_steps"] == 128 and spec["algo.clip"] == 0.05, name
        assert spec["model.recurrent"] == "gru" and spec["model.hidden"] == [128, 128], name
    for name in ("mappo-3m", "ippo-3m"):
        assert specs[name]["algo.lr"] == 0.004 and specs[name]["algo.anneal_lr"] is True, name
    # 2s3z's baseline stopped halfway through a 10M-step anneal: the cell's schedule is that
    # anneal's line, to the step it stopped at.
    stop = specs["mappo-2s3z"]["train.total_env_steps"]
    assert specs["mappo-2s3z"]["algo.anneal_lr"] is False
    line = specs["mappo-2s3z"]["train.schedule.algo.lr.linear"]
    assert line == [[0, 0.004], [stop, pytest.approx(0.004 * (1 - stop / 10_000_000))]]
    # The replay family keeps its own settings, with SMAX's discount and no GRU.
    masac = specs["masac-3m"]
    assert masac["algo.gamma"] == 0.99 and masac["model.recurrent"] in (None, "none")
    assert "algo.clip" not in masac and masac["model.hidden"] == [128, 128]
    # The two IPPO/MAPPO cells on 3m differ in the algorithm alone.
    assert set(differences(specs["mappo-3m"], specs["ippo-3m"])) == {"algo.name"}


@pytest.mark.skipif(not lookup("vmas/het_mass").installed, reason="vmas is not installed")
def test_het_mass_rewards_the_light_agent_running_and_the_heavy_one_resting() -> None:
    """Every joint action held for a whole episode: the best is agent 0 (mass 4) at rest and
    agent 1 (mass 2) pushing, well above idling both (0) and random play."""
    import torch

    from marlctl.envs.vmas import VmasEnv

    params = cell_specs("baseline-vmas-het", ["mappo-het_mass"])["mappo-het_mass"]
    params = {k[len("env.params.") :]: v for k, v in params.items() if k.startswith("env.params.")}
    episodes = 2
    probe = VmasEnv("vmas/het_mass", "het_mass", params, 1, torch.device("cpu"))
    (group,) = probe.info.groups
    joint = list(itertools.product(range(group.n_actions), repeat=group.n_agents))
    table = torch.tensor(joint).repeat_interleave(episodes, 0)
    env = VmasEnv("vmas/het_mass", "het_mass", params, len(table), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)

    def play(pick) -> torch.Tensor:
        """One episode in every env, `pick()` the actions each step: per-agent returns."""
        env.reset(0)
        total = torch.zeros(len(table))
        running = torch.ones(len(table), dtype=torch.bool)
        while running.any():
            step = env.step({group.name: pick()})
            total += torch.where(running, step.rewards[group.name].mean(-1), 0.0)
            running &= ~(step.terminated | step.truncated)
        return total

    held = play(lambda: table).view(len(joint), episodes).mean(1)
    random = play(lambda: torch.randint(group.n_actions, table.shape, generator=generator))
    best = joint[int(held.argmax())]
    assert best[0] == 0 and best[1] != 0
    assert float(held.max()) > 5.0 and float(random.mean()) < 0.0
