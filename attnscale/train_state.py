"""Train state, optimizer, device mesh and orbax checkpoints.

The train state is a plain dict {"step", "params", "opt_state"}: params is the
model's `nnx.State`, the model's structure (graphdef) stays outside, so the
state is an ordinary pytree that jit can donate and orbax can save. Randomness
(dropout) and data order are functions of (config.seed, step), so `step` is the
whole data position and RNG state: restoring it resumes bit-for-bit.

Parallelism: one `jax.sharding.Mesh` over all devices (of all processes) with a
`data` axis; params and optimizer state are replicated, batches sharded on
`data` (data parallel; XLA inserts the gradient all-reduce).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attnscale.model import ModelConfig, Transformer
from attnscale.unit_model import UnitScaledTransformer

State = dict[str, Any]


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig(**config.model.to_dict())


def make_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh over every device of every process, axis `data`."""
  return jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))


def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up to config.learning_rate, then constant or cosine decay."""
  warmup = optax.linear_schedule(0.0, config.learning_rate, max(config.warmup_steps, 1))
  if config.lr_schedule == "constant":
    after = optax.constant_schedule(config.learning_rate)
  else:  # cosine down to min_learning_rate at num_train_steps (nanoGPT's lr_decay_iters)
    decay_steps = max(config.num_train_steps - config.warmup_steps, 1)
    after = optax.cosine_decay_schedule(config.learning_rate, decay_steps,
                                        alpha=config.min_learning_rate / config.learning_rate)
  if config.warmup_steps == 0:
    return after
  return optax.join_schedules([warmup, after], [config.warmup_steps])


def make_optimizer(config) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(config)
  if config.optimizer == "adam":
    opt = optax.adam(schedule, b1=config.b1, b2=config.b2)
  else:
    # nanoGPT decays only the matrices and embeddings (ndim >= 2), never gains.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    opt = optax.adamw(schedule, b1=config.b1, b2=config.b2,
                      weight_decay=config.weight_decay, mask=decay_mask)
  if config.grad_clip > 0:
    opt = optax.chain(optax.clip_by_global_norm(config.grad_clip), opt)
  return opt


def init_model(config) -> Transformer | UnitScaledTransformer:
  cfg = model_config(config)
  model_cls = UnitScaledTransformer if cfg.variant == "unit_scaled" else Transformer
  return model_cls(cfg, rngs=nnx.Rngs(params=config.seed))


def create_state(config, mesh) -> tuple[nnx.GraphDef, State, Any]:
  """Initialises the train state directly into its (replicated) shardings.

  Shapes first (jax.eval_shape), then shardings, then a jitted init: no
  device ever holds an unsharded copy (big_vision/nanodo style).

  Returns:
    (graphdef, state, state_shardings).
  """
  tx = make_optimizer(config)

  def init():
    graphdef, params = nnx.split(init_model(config), nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params)}

  abstract = jax.eval_shape(init)
  shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract)
  state = jax.jit(init, out_shardings=shardings)()
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: init_model(config)), nnx.Param)
  return graphdef, state, shardings


def abstract_state(state, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


class Checkpoints:
  """Orbax checkpoints of the train state in WORKDIR/checkpoints.

  Saves are asynchronous; `close` waits for the last one. A step that is already
  on disk is never overwritten.
  """

  def __init__(self, workdir: str, keep: int):
    self.manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: State) -> None:
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, state: State, shardings, step: int | None = None) -> State:
    """Restores `step` (default: latest) into the layout of `state`."""
    step = self.latest_step() if step is None else step
    return self.manager.restore(
        step, args=ocp.args.StandardRestore(abstract_state(state, shardings)))

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
