"""Throughput benchmark for JaxMARL on MPE ``MPE_simple_spread_v3``.

Standalone harness (it does not import marlctl) that measures, on whatever
device JAX selects, two kinds of work for each ``--num-envs`` value:

``env_only``
    Random-action stepping of the vmapped JaxMARL environment (``env.step``,
    which auto-resets finished episodes exactly as JaxMARL does), with a
    ``jax.lax.scan`` over ``--env-steps`` steps inside one ``jax.jit``.
    Reported: env steps/s = num_envs * env_steps / seconds (median over
    ``--repeats`` calls of the compiled function, ``block_until_ready``),
    and the ahead-of-time compile time (``.lower().compile()``) separately.

``ippo``
    IPPO-FF training following JaxMARL's published baseline
    ``baselines/IPPO/ippo_ff_mpe.py`` with its config ``ippo_ff_mpe.yaml``:
    NUM_STEPS=128, UPDATE_EPOCHS=4, NUM_MINIBATCHES=4, LR=2.5e-4 with linear
    annealing, GAMMA=0.99, GAE_LAMBDA=0.95, CLIP_EPS=0.2, ENT_COEF=0.01,
    VF_COEF=0.5, MAX_GRAD_NORM=0.5, tanh, separate 64x64 actor and 64x64
    critic with the baseline's orthogonal initialisation, one shared network
    applied to all agents' observations batched agent-major (``batchify``),
    the MPE log wrapper (episode returns logged as reward * num_agents), the
    clipped value loss, per-minibatch advantage normalisation, and the same
    ``make_train(config)`` structure: a jitted ``train(rng)`` that scans over
    updates, each scanning ``NUM_STEPS`` env steps, computing GAE with a
    reverse scan, then scanning epochs and shuffled minibatches.
    Reported: env steps/s = num_seeds * NUM_ENVS * NUM_STEPS * updates /
    seconds (median over ``--repeats`` calls after one warm-up call of the
    compiled function), the compile time, and the mean episode return of the
    first and last update (``return_first``/``return_last``: the baseline's
    ``returned_episode_returns`` metric, a mean over all steps and actors).

Differences from the baseline script:

* no ``distrax``: the categorical policy uses ``jax.random.categorical`` for
  sampling and ``jax.nn.log_softmax`` for log-probabilities and entropy;
* no ``wandb``/``hydra``/``matplotlib``: the per-update
  ``jax.experimental.io_callback`` that logged metrics to wandb is removed,
  metrics are returned from the scan instead;
* ``NUM_UPDATES`` is ``--updates`` (the learning-rate schedule anneals over
  those updates) instead of ``TOTAL_TIMESTEPS // NUM_STEPS // NUM_ENVS``;
* ``batchify`` has no padding branch (all simple_spread observations have
  the same size, so the baseline never pads either);
* ``NUM_SEEDS`` defaults to 1 (``--num-seeds``; the baseline vmaps 10);
* ``MPELogWrapper`` lives in ``jaxmarl.wrappers.baselines``, which imports
  gymnax, safetensors and OvercookedV2, so an equivalent wrapper is defined
  here; the returned episode return is also averaged over completed
  episodes only (``return_*_completed``) besides the baseline's metric.

Dependencies at import time: jax, jaxlib, flax, optax, chex, numpy and the
``jaxmarl`` 0.2.0 wheel installed with ``--no-deps``.  ``import jaxmarl``
itself would load every environment (and needs jaxtyping, matplotlib and
prints to stdout), so only ``jaxmarl.environments.mpe.simple_spread`` and
the modules it imports are loaded, with the package ``__init__`` files
bypassed.  ``jaxtyping`` (used by JaxMARL only in annotations) is used when
installed and replaced by an annotation-only stand-in otherwise.

Usage::

    python bench/gpu_jaxmarl.py --work env_only ippo --num-envs 1024 4096 \
        --updates 10 --env-steps 128 --repeats 3 --json results.jsonl

One JSON object per measurement is printed per line on stdout; a failing
configuration (e.g. out of memory) yields a line with an ``error`` field.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import time
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState

ENV_NAME = "MPE_simple_spread_v3"

BASELINE_CONFIG: dict[str, Any] = {
    "LR": 2.5e-4,
    "NUM_ENVS": 16,
    "NUM_STEPS": 128,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": ENV_NAME,
    "ENV_KWARGS": {},
    "ANNEAL_LR": True,
    "SEED": 30,
}


def _jaxtyping_standin() -> types.ModuleType:
    """Annotation-only replacement for ``jaxtyping`` (``Float[Array, "..."]``)."""

    class _DtypeAnnotation:
        def __class_getitem__(cls, item: Any) -> Any:
            return jax.Array

    module = types.ModuleType("jaxtyping")
    module.Array = jax.Array  # type: ignore[attr-defined]
    module.PRNGKeyArray = jax.Array  # type: ignore[attr-defined]

    def _getattr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _DtypeAnnotation

    module.__getattr__ = _getattr  # type: ignore[method-assign]
    return module


@functools.cache
def load_simple_spread_class() -> type:
    """Import ``SimpleSpreadMPE`` without running jaxmarl's package ``__init__``s."""
    spec = importlib.util.find_spec("jaxmarl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("jaxmarl is not installed")
    if importlib.util.find_spec("jaxtyping") is None:
        sys.modules.setdefault("jaxtyping", _jaxtyping_standin())
    root = list(spec.submodule_search_locations)[0]
    for name, sub in (
        ("jaxmarl", ""),
        ("jaxmarl.environments", "/environments"),
        ("jaxmarl.environments.mpe", "/environments/mpe"),
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [root + sub]
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            package.__spec__.submodule_search_locations = [root + sub]
            sys.modules[name] = package
    module = importlib.import_module("jaxmarl.environments.mpe.simple_spread")
    return module.SimpleSpreadMPE


def make_env(env_name: str, env_kwargs: dict[str, Any]) -> Any:
    """Equivalent of ``jaxmarl.make`` restricted to ``MPE_simple_spread_v3``."""
    if env_name != ENV_NAME:
        raise ValueError(f"only {ENV_NAME} is supported, got {env_name}")
    return load_simple_spread_class()(**env_kwargs)


@struct.dataclass
class LogEnvState:
    env_state: Any
    episode_returns: jax.Array
    episode_lengths: jax.Array
    returned_episode_returns: jax.Array
    returned_episode_lengths: jax.Array


class MPELogWrapper:
    """Same behaviour as ``jaxmarl.wrappers.baselines.MPELogWrapper``.

    Logs episode returns (reward times the number of agents, as in the
    on-policy codebase) and lengths; rewards passed to the learner are
    unchanged.
    """

    def __init__(self, env: Any) -> None:
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def stack_agent_values(self, x: dict[str, jax.Array]) -> jax.Array:
        return jnp.stack([x[a] for a in self._env.agents])

    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], LogEnvState]:
        obs, env_state = self._env.reset(key)
        zeros = jnp.zeros((self._env.num_agents,))
        return obs, LogEnvState(env_state, zeros, zeros, zeros, zeros)

    def step(
        self, key: jax.Array, state: LogEnvState, action: dict[str, jax.Array]
    ) -> tuple[Any, LogEnvState, Any, Any, dict[str, jax.Array]]:
        obs, env_state, reward, done, info = self._env.step(key, state.env_state, action)
        rewardlog = jax.tree.map(lambda x: x * self._env.num_agents, reward)
        ep_done = done["__all__"]
        new_episode_return = state.episode_returns + self.stack_agent_values(rewardlog)
        new_episode_length = state.episode_lengths + 1
        state = LogEnvState(
            env_state=env_state,
            episode_returns=new_episode_return * (1 - ep_done),
            episode_lengths=new_episode_length * (1 - ep_done),
            returned_episode_returns=state.returned_episode_returns * (1 - ep_done)
            + new_episode_return * ep_done,
            returned_episode_lengths=state.returned_episode_lengths * (1 - ep_done)
            + new_episode_length * ep_done,
        )
        info = dict(info)
        info["returned_episode_returns"] = state.returned_episode_returns
        info["returned_episode_lengths"] = state.returned_episode_lengths
        info["returned_episode"] = jnp.full((self._env.num_agents,), ep_done)
        return obs, state, reward, done, info


class ActorCritic(nn.Module):
    action_dim: int
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        activation = nn.relu if self.activation == "relu" else nn.tanh
        actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
        actor_mean = activation(actor_mean)
        actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(
            actor_mean
        )
        actor_mean = activation(actor_mean)
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(
            actor_mean
        )

        critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
        critic = activation(critic)
        critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(critic)
        critic = activation(critic)
        critic = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
        return logits, jnp.squeeze(critic, axis=-1)


def categorical_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]


def categorical_entropy(logits: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict[str, jax.Array]


def batchify(x: dict[str, jax.Array], agent_list: Sequence[str], num_actors: int) -> jax.Array:
    dims = {x[a].shape[-1] if x[a].ndim > 1 else 1 for a in agent_list}
    if len(dims) != 1:
        raise ValueError("per-agent arrays must share their last dimension")
    stacked = jnp.stack([x[a] for a in agent_list])
    return stacked.reshape((num_actors, -1))


def unbatchify(
    x: jax.Array, agent_list: Sequence[str], num_envs: int, num_actors: int
) -> dict[str, jax.Array]:
    x = x.reshape((num_actors, num_envs, -1))
    return {a: x[i] for i, a in enumerate(agent_list)}


def make_train(config: dict[str, Any]) -> Callable[[jax.Array], dict[str, Any]]:
    """Build the IPPO-FF ``train(rng)`` function of the JaxMARL baseline."""
    env = make_env(config["ENV_NAME"], config["ENV_KWARGS"])
    config["NUM_ACTORS"] = env.num_agents * config["NUM_ENVS"]
    config["MINIBATCH_SIZE"] = (
        config["NUM_ACTORS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]
    )
    env = MPELogWrapper(env)

    def linear_schedule(count: jax.Array) -> jax.Array:
        frac = (
            1.0
            - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"]))
            / config["NUM_UPDATES"]
        )
        return config["LR"] * frac

    def train(rng: jax.Array) -> dict[str, Any]:
        network = ActorCritic(env.action_space(env.agents[0]).n, activation=config["ACTIVATION"])
        rng, _rng = jax.random.split(rng)
        init_x = jnp.zeros(env.observation_space(env.agents[0]).shape)
        network_params = network.init(_rng, init_x)
        if config["ANNEAL_LR"]:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(learning_rate=linear_schedule, eps=1e-5),
            )
        else:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(config["LR"], eps=1e-5),
            )
        train_state = TrainState.create(apply_fn=network.apply, params=network_params, tx=tx)

        rng, _rng = jax.random.split(rng)
        reset_rng = jax.random.split(_rng, config["NUM_ENVS"])
        obsv, env_state = jax.vmap(env.reset)(reset_rng)

        def _update_step(
            runner_state: tuple[Any, ...], unused: None
        ) -> tuple[tuple[Any, ...], dict[str, jax.Array]]:
            def _env_step(
                runner_state: tuple[Any, ...], unused: None
            ) -> tuple[tuple[Any, ...], Transition]:
                train_state, env_state, last_obs, rng = runner_state

                obs_batch = batchify(last_obs, env.agents, config["NUM_ACTORS"])
                rng, _rng = jax.random.split(rng)
                logits, value = network.apply(train_state.params, obs_batch)
                action = jax.random.categorical(_rng, logits)
                log_prob = categorical_log_prob(logits, action)
                env_act = unbatchify(action, env.agents, config["NUM_ENVS"], env.num_agents)

                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, config["NUM_ENVS"])
                obsv, env_state, reward, done, info = jax.vmap(env.step)(
                    rng_step, env_state, env_act
                )
                info = jax.tree.map(lambda x: x.reshape((config["NUM_ACTORS"],)), info)
                transition = Transition(
                    batchify(done, env.agents, config["NUM_ACTORS"]).squeeze(-1),
                    action,
                    value,
                    batchify(reward, env.agents, config["NUM_ACTORS"]).squeeze(-1),
                    log_prob,
                    obs_batch,
                    info,
                )
                runner_state = (train_state, env_state, obsv, rng)
                return runner_state, transition

            runner_state, traj_batch = jax.lax.scan(
                _env_step, runner_state, None, config["NUM_STEPS"]
            )

            train_state, env_state, last_obs, rng = runner_state
            last_obs_batch = batchify(last_obs, env.agents, config["NUM_ACTORS"])
            _, last_val = network.apply(train_state.params, last_obs_batch)

            def _calculate_gae(
                traj_batch: Transition, last_val: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
                def _get_advantages(
                    gae_and_next_value: tuple[jax.Array, jax.Array],
                    transition: Transition,
                ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
                    gae, next_value = gae_and_next_value
                    done, value, reward = (
                        transition.done,
                        transition.value,
                        transition.reward,
                    )
                    delta = reward + config["GAMMA"] * next_value * (1 - done) - value
                    gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(
                    _get_advantages,
                    (jnp.zeros_like(last_val), last_val),
                    traj_batch,
                    reverse=True,
                    unroll=8,
                )
                return advantages, advantages + traj_batch.value

            advantages, targets = _calculate_gae(traj_batch, last_val)

            def _update_epoch(
                update_state: tuple[Any, ...], unused: None
            ) -> tuple[tuple[Any, ...], dict[str, jax.Array]]:
                def _update_minbatch(
                    train_state: TrainState,
                    batch_info: tuple[Transition, jax.Array, jax.Array],
                ) -> tuple[TrainState, dict[str, jax.Array]]:
                    traj_batch, advantages, targets = batch_info

                    def _loss_fn(
                        params: Any,
                        traj_batch: Transition,
                        gae: jax.Array,
                        targets: jax.Array,
                    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
                        logits, value = network.apply(params, traj_batch.obs)
                        log_prob = categorical_log_prob(logits, traj_batch.action)

                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"]
                        )
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()

                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor1 = ratio * gae
                        loss_actor2 = (
                            jnp.clip(
                                ratio,
                                1.0 - config["CLIP_EPS"],
                                1.0 + config["CLIP_EPS"],
                            )
                            * gae
                        )
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2).mean()
                        entropy = categorical_entropy(logits).mean()

                        total_loss = (
                            loss_actor
                            + config["VF_COEF"] * value_loss
                            - config["ENT_COEF"] * entropy
                        )
                        return total_loss, (value_loss, loss_actor, entropy, ratio)

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    train_state = train_state.apply_gradients(grads=grads)
                    loss_info = {
                        "total_loss": total_loss[0],
                        "actor_loss": total_loss[1][1],
                        "critic_loss": total_loss[1][0],
                        "entropy": total_loss[1][2],
                        "ratio": total_loss[1][3],
                    }
                    return train_state, loss_info

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = config["MINIBATCH_SIZE"] * config["NUM_MINIBATCHES"]
                assert batch_size == config["NUM_STEPS"] * config["NUM_ACTORS"], (
                    "batch size must be equal to number of steps * number of actors"
                )
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled_batch = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree.map(
                    lambda x: jnp.reshape(x, [config["NUM_MINIBATCHES"], -1] + list(x.shape[1:])),
                    shuffled_batch,
                )
                train_state, loss_info = jax.lax.scan(_update_minbatch, train_state, minibatches)
                update_state = (train_state, traj_batch, advantages, targets, rng)
                return update_state, loss_info

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, loss_info = jax.lax.scan(
                _update_epoch, update_state, None, config["UPDATE_EPOCHS"]
            )
            train_state = update_state[0]
            rng = update_state[-1]

            completed = traj_batch.info["returned_episode"]
            completed_return = jnp.sum(
                traj_batch.info["returned_episode_returns"] * completed
            ) / jnp.maximum(jnp.sum(completed), 1)
            r0 = {"ratio0": loss_info["ratio"][0, 0].mean()}
            loss_info = jax.tree.map(lambda x: x.mean(), loss_info)
            metric = jax.tree.map(lambda x: x.mean(), traj_batch.info)
            metric = {
                **metric,
                **loss_info,
                **r0,
                "completed_episode_returns": completed_return,
            }
            runner_state = (train_state, env_state, last_obs, rng)
            return runner_state, metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None, config["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metric}

    return train


def make_env_only(
    num_envs: int, env_steps: int
) -> tuple[Callable[..., Any], Callable[[jax.Array], Any]]:
    """Return (jitted rollout, jitted reset) for random-action stepping."""
    env = make_env(ENV_NAME, {})
    num_actions = {a: env.action_space(a).n for a in env.agents}

    def reset(rng: jax.Array) -> tuple[Any, Any]:
        return jax.vmap(env.reset)(jax.random.split(rng, num_envs))

    def rollout(env_state: Any, rng: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        def _step(
            carry: tuple[Any, jax.Array, jax.Array], unused: None
        ) -> tuple[tuple[Any, jax.Array, jax.Array], None]:
            env_state, rng, reward_sum = carry
            rng, key_act, key_step = jax.random.split(rng, 3)
            act_keys = jax.random.split(key_act, env.num_agents)
            actions = {
                a: jax.random.randint(act_keys[i], (num_envs,), 0, num_actions[a])
                for i, a in enumerate(env.agents)
            }
            step_keys = jax.random.split(key_step, num_envs)
            _, env_state, reward, _, _ = jax.vmap(env.step)(step_keys, env_state, actions)
            step_reward = sum(r.sum() for r in reward.values()) / env.num_agents
            reward_sum = reward_sum + step_reward
            return (env_state, rng, reward_sum), None

        (env_state, rng, reward_sum), _ = jax.lax.scan(
            _step, (env_state, rng, jnp.zeros(())), None, env_steps
        )
        return env_state, rng, reward_sum

    return jax.jit(rollout), jax.jit(reset)


def device_description() -> str:
    device = jax.devices()[0]
    return f"{device.platform}:{device.id} {device.device_kind}"


def base_record(work: str, num_envs: int) -> dict[str, Any]:
    return {
        "impl": "jaxmarl",
        "work": work,
        "env": ENV_NAME,
        "num_envs": num_envs,
        "device": device_description(),
        "jax": jax.__version__,
        "jaxmarl": importlib.metadata.version("jaxmarl"),
    }


def bench_env_only(num_envs: int, env_steps: int, repeats: int, seed: int) -> dict[str, Any]:
    record = base_record("env_only", num_envs)
    record["env_steps"] = env_steps
    rollout, reset = make_env_only(num_envs, env_steps)
    rng = jax.random.PRNGKey(seed)
    rng, reset_rng = jax.random.split(rng)
    _, env_state = jax.block_until_ready(reset(reset_rng))

    t0 = time.perf_counter()
    compiled = rollout.lower(env_state, rng).compile()
    record["compile_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    env_state, rng, reward_sum = jax.block_until_ready(compiled(env_state, rng))
    record["first_call_s"] = time.perf_counter() - t0

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        env_state, rng, reward_sum = jax.block_until_ready(compiled(env_state, rng))
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    record["seconds"] = seconds
    record["times_s"] = times
    record["env_steps_per_s"] = num_envs * env_steps / seconds
    record["mean_reward"] = float(reward_sum) / (num_envs * env_steps)
    return record


def bench_ippo(
    num_envs: int,
    updates: int,
    num_steps: int,
    num_seeds: int,
    repeats: int,
    seed: int,
    return_curve: bool,
) -> dict[str, Any]:
    record = base_record("ippo", num_envs)
    config = dict(BASELINE_CONFIG)
    config.update(NUM_ENVS=num_envs, NUM_STEPS=num_steps, NUM_UPDATES=updates, SEED=seed)
    record.update(updates=updates, num_steps=num_steps, num_seeds=num_seeds)

    train = make_train(config)
    train_fn = jax.vmap(train) if num_seeds > 1 else train
    train_jit = jax.jit(train_fn)

    def seed_keys(offset: int) -> jax.Array:
        key = jax.random.PRNGKey(seed + offset)
        return jax.random.split(key, num_seeds) if num_seeds > 1 else key

    t0 = time.perf_counter()
    compiled = train_jit.lower(seed_keys(0)).compile()
    record["compile_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(seed_keys(0)))
    record["first_call_s"] = time.perf_counter() - t0
    metrics = out["metrics"]

    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(seed_keys(i + 1)))
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    record["seconds"] = seconds
    record["times_s"] = times
    record["env_steps_per_s"] = num_seeds * num_envs * num_steps * updates / seconds

    returns = np.asarray(metrics["returned_episode_returns"]).reshape(num_seeds, updates)
    completed = np.asarray(metrics["completed_episode_returns"]).reshape(num_seeds, updates)
    record["return_first"] = float(returns[:, 0].mean())
    record["return_last"] = float(returns[:, -1].mean())
    record["return_first_completed"] = float(completed[:, 0].mean())
    record["return_last_completed"] = float(completed[:, -1].mean())
    if return_curve:
        record["return_curve"] = [float(v) for v in completed.mean(axis=0)]
    return record


def emit(record: dict[str, Any], json_path: str | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if json_path:
        with open(json_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", nargs="+", choices=["env_only", "ippo"], default=["env_only", "ippo"]
    )
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--num-steps", type=int, default=BASELINE_CONFIG["NUM_STEPS"])
    parser.add_argument("--num-seeds", type=int, default=1)
    parser.add_argument("--env-steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=BASELINE_CONFIG["SEED"])
    parser.add_argument(
        "--return-curve",
        action="store_true",
        help="include the per-update mean episode return in ippo records",
    )
    parser.add_argument("--json", dest="json_path", default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    failures = 0
    for work in args.work:
        for num_envs in args.num_envs:
            runner: Callable[[], dict[str, Any]]
            if work == "env_only":
                runner = functools.partial(
                    bench_env_only, num_envs, args.env_steps, args.repeats, args.seed
                )
            else:
                runner = functools.partial(
                    bench_ippo,
                    num_envs,
                    args.updates,
                    args.num_steps,
                    args.num_seeds,
                    args.repeats,
                    args.seed,
                    args.return_curve,
                )
            try:
                record = runner()
            except Exception as exc:
                failures += 1
                traceback.print_exc(file=sys.stderr)
                record = {
                    "impl": "jaxmarl",
                    "work": work,
                    "env": ENV_NAME,
                    "num_envs": num_envs,
                    "error": f"{type(exc).__name__}: {str(exc)[:2000]}",
                }
            emit(record, args.json_path)
            jax.clear_caches()
            gc.collect()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
