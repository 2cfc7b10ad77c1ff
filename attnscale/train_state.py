"""Train state, optimizer, device mesh and orbax checkpoints.

The train state is a plain dict {"step", "params", "opt_state", "last_losses"}:
params is the model's `nnx.State`, the model's structure (graphdef) stays
outside, so the state is an ordinary pytree that jit can donate and orbax can
save. Randomness (dropout) and data order are functions of (config.seed, step),
so `step` is the whole data position and RNG state: restoring it resumes
bit-for-bit. `last_losses` is the window of the last `LAST_LOSSES` training
losses (the train step pushes each step's), so the final-loss metric
(`loss_last20`) is checkpointed with the step it belongs to and a resumed run
reports the uninterrupted run's value. A checkpoint written before the window
existed restores with an empty one (`Checkpoints.restore`).

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

from attnscale import models
from attnscale.models import ModelConfig

State = dict[str, Any]

# Graphcore's final training loss is the mean of the last 20 steps' losses.
LAST_LOSSES = 20

# State entries a checkpoint may lack because it predates them: restoring one
# keeps their initial value (see `Checkpoints.restore`).
ADDED_STATE_ENTRIES = ("last_losses",)


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


def init_model(config) -> models.Model:
  """The model `config.model.variant` names (`attnscale.models.VARIANTS`)."""
  return models.build(model_config(config), rngs=nnx.Rngs(params=config.seed))


def init_last_losses() -> dict[str, jax.Array]:
  """An empty loss window: {"loss_W": float32 [W], "count": int32 []}, W = LAST_LOSSES.

  The newest loss is loss_W[-1]; only the last `count` entries are losses.
  """
  return {"loss_W": jnp.zeros((LAST_LOSSES,), jnp.float32), "count": jnp.zeros((), jnp.int32)}


def push_loss(last_losses: dict[str, jax.Array], loss) -> dict[str, jax.Array]:
  """The window with `loss` appended (the oldest dropped once it holds W); jittable."""
  loss_W = jnp.roll(last_losses["loss_W"], -1).at[-1].set(jnp.asarray(loss, jnp.float32))
  return {"loss_W": loss_W, "count": jnp.minimum(last_losses["count"] + 1, LAST_LOSSES)}


def mean_last_losses(last_losses) -> float:
  """The mean of the window's losses, oldest to newest in float64 (NaN if empty)."""
  count = int(last_losses["count"])
  if count == 0:
    return float("nan")
  return float(np.mean([float(x) for x in np.asarray(last_losses["loss_W"])[-count:]]))


def create_state(config, mesh, tx: optax.GradientTransformation | None = None,
                 ) -> tuple[nnx.GraphDef, State, Any]:
  """Initialises the train state directly into its (replicated) shardings.

  Shapes first (jax.eval_shape), then shardings, then a jitted init: no
  device ever holds an unsharded copy (big_vision/nanodo style).

  Args:
    config: the run's config.
    mesh: the device mesh (`make_mesh`).
    tx: the optimizer whose state to initialise; the training loop builds it
      once and hands the same one to `steps.make_train_step`. None builds
      `make_optimizer(config)` (enough for restoring a checkpoint's layout).

  Returns:
    (graphdef, state, state_shardings).
  """
  tx = make_optimizer(config) if tx is None else tx

  def init():
    graphdef, params = nnx.split(init_model(config), nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "last_losses": init_last_losses()}

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
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        # Named, so that `item_metadata` can read a checkpoint this manager did not write.
        item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: State) -> None:
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, state: State, shardings, step: int | None = None) -> State:
    """Restores `step` (default: latest) into the layout of `state`.

    An entry of `ADDED_STATE_ENTRIES` that the checkpoint lacks (it was written
    before the entry existed) keeps its value in `state`, the initial one.

    Raises:
      ValueError: there is no checkpoint `step`, or it holds entries this code
        does not know, or lacks one it cannot do without (one line, naming them).
    """
    step = self.latest_step() if step is None else step
    if step not in self.manager.all_steps():
      raise ValueError(f"no checkpoint of step {step} in {self.manager.directory} "
                       f"(it has steps {sorted(self.manager.all_steps())})")
    saved = set(self.manager.item_metadata(step).keys())
    lacking = [k for k in state if k not in saved]
    unknown = sorted(saved - set(state))
    if unknown or set(lacking) - set(ADDED_STATE_ENTRIES):
      raise ValueError(
          f"checkpoint {step} in {self.manager.directory} has the state entries "
          f"{sorted(saved)}, this code expects {sorted(state)}: was it written by "
          "another version of attnscale?")
    kept = [k for k in state if k in saved]
    restored = self.manager.restore(step, args=ocp.args.StandardRestore(
        abstract_state({k: state[k] for k in kept}, {k: shardings[k] for k in kept})))
    return {k: restored[k] if k in saved else state[k] for k in state}

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
