"""Auto-reset of native envs: on the CPU, ended envs take start states drawn ahead per seed
block; in graph-safe mode every step draws start states for all envs. Either way a restarted
episode starts from a fresh state of the env's start distribution, and a seed block steps
exactly as the same seed does alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marlctl.envs.native import native_class

SHORT_LBF = ("lbf/Foraging-8x8-2p-2f-coop-v3", {"max_episode_steps": 3})


def _actions(env, ob, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
    """Random allowed actions, each seed block's from its own generator."""
    actions = {}
    for g in env.info.groups:
        mask = ob.masks[g.name]
        rows = env.num_envs // len(generators)
        scores = torch.cat([torch.rand(rows, *mask.shape[1:], generator=r) for r in generators])
        actions[g.name] = scores.masked_fill(~mask, -1.0).argmax(-1)
    return actions


def _run(env_id: str, params: dict, seeds: list[int], rows: int, steps: int, safe: bool):
    """Each step's observations, per seed block: `[steps, blocks, rows, ...]`."""
    env = native_class(env_id)(params, rows * len(seeds), "cpu", seeds=len(seeds))
    if safe:
        env.make_graph_safe()
    generators = [torch.Generator().manual_seed(1000 + s) for s in seeds]
    ob = env.reset(seeds if len(seeds) > 1 else seeds[0])
    group = env.info.groups[0].name
    seen, ends = [], 0
    for _ in range(steps):
        tr = env.step(_actions(env, ob, generators))
        ends += int((tr.terminated | tr.truncated).sum())
        ob = tr.next
        seen.append(ob.obs[group].view(len(seeds), rows, *ob.obs[group].shape[1:]).clone())
    return torch.stack(seen), ends


@pytest.mark.parametrize("safe", [False, True], ids=["ahead", "graph-safe"])
@pytest.mark.parametrize(("env_id", "params"), [("smax/3m", {}), SHORT_LBF])
def test_a_seed_block_restarts_exactly_as_the_seed_does_alone(env_id, params, safe):
    seeds, rows, steps = [3, 7, 11], 6, 120
    batched, ends = _run(env_id, params, seeds, rows, steps, safe)
    assert ends > 3 * len(seeds) * rows  # every env restarted several times
    for b, seed in enumerate(seeds):
        alone, _ = _run(env_id, params, [seed], rows, steps, safe)
        assert torch.equal(batched[:, b], alone[:, 0]), seed


def _starts_by_restart(n_envs: int, episodes: int) -> dict[str, list[int]]:
    """Player levels and cells of the start states that restarts hand out (every episode
    lasts 3 steps), first episodes excluded."""
    env = native_class(SHORT_LBF[0])(SHORT_LBF[1], n_envs, "cpu")
    generators = [torch.Generator().manual_seed(5)]
    ob = env.reset(0)
    out = {"level": [], "pcell": [], "state": []}
    while len(out["state"]) < episodes:
        tr = env.step(_actions(env, ob, generators))
        ob = tr.next
        ended = (tr.terminated | tr.truncated).nonzero().flatten()
        for i in ended.tolist():
            cells = (env.pos[i, :, 0] * env.cols + env.pos[i, :, 1]).tolist()
            foods = (env.food_pos[i, :, 0] * env.cols + env.food_pos[i, :, 1]).tolist()
            out["level"] += env.level[i].tolist()
            out["pcell"] += cells
            out["state"].append((*cells, *foods, *env.level[i].tolist()))
    return out


def test_restarted_episodes_start_from_fresh_states_of_the_start_distribution():
    restarts = _starts_by_restart(16, 3000)
    env = native_class(SHORT_LBF[0])(SHORT_LBF[1], 3000, "cpu")
    env.reset(1)
    drawn = {
        "level": env.level.flatten().tolist(),
        "pcell": (env.pos[..., 0] * env.cols + env.pos[..., 1]).flatten().tolist(),
    }
    # No state handed out twice: a reused state would repeat whole start states, where
    # distinct draws of two players' cells, two foods' cells and levels rarely coincide.
    assert len(set(restarts["state"])) >= 0.99 * len(restarts["state"])
    for key, bins in (("level", 8), ("pcell", 64)):
        a = np.bincount(restarts[key], minlength=bins) / len(restarts[key])
        b = np.bincount(drawn[key], minlength=bins) / len(drawn[key])
        # Sampling noise at these counts stays under half the bound (the package-parity
        # test's bound for the same quantities).
        assert 0.5 * np.abs(a - b).sum() < (0.06 if "cell" in key else 0.04), key


@pytest.mark.parametrize("env_id", ["smax/3m", "smax/smacv2_5_units", SHORT_LBF[0]])
def test_reset_leaves_start_states_laid_out_as_restarts_leave_them(env_id):
    """A compiled step guards on its inputs' strides: states laid out otherwise after the
    first restart would recompile it in the middle of a run."""
    env = native_class(env_id)({}, 8, "cpu")
    state = env.start(8)
    ob = env.reset(0)
    assert all(getattr(env, key).is_contiguous() for key in state), env_id
    before = {key: getattr(env, key).stride() for key in state}
    generators = [torch.Generator().manual_seed(0)]
    for _ in range(env.max_cycles):
        ob = env.step(_actions(env, ob, generators)).next
    assert {key: getattr(env, key).stride() for key in state} == before
