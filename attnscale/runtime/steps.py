"""The jitted train and eval steps, and the host helpers that feed them.

    make_train_step(graphdef, task, run, state_shardings, batch_sharding)
    train_step_fn(graphdef, task, run)         # the same step, unjitted (packed sweeps vmap it)
    make_eval_step(graphdef, task, param_shardings, batch_sharding)
    make_layer_stats(graphdef, task, run, mesh)  # sinks and massive activations, per layer
    global_batch(local_batch, sharding)
    evaluate_sums(eval_step, params, batches, sharding) / evaluate(...)

The training loop's programs (`train_lib`, `packed`) and evaluation (`eval_lib`)
build on this module, so evaluating a checkpoint never imports the loop. A step is a pure
function of (state, batch): dropout randomness is a function of (seed, step)
(`dropout_key`) and the data of `step` comes from the task, so a restored state
continues exactly where the saved one stopped.

Both steps are traced under their mesh (`jax.sharding.use_abstract_mesh`), so
the model sees which platform it is compiled for (the attention kernel follows
it: `attnscale.core.fused.target_platform`) and keeps its activations on the batch axes
(`sharding.constrain_batch`).

Dimension legend: W the window of recent losses (`train_state.LAST_LOSSES`).
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnscale.config import run as run_config
from attnscale.models import base as models_base
from attnscale.models import layer_stats
from attnscale.runtime import optimizers
from attnscale.runtime import train_state as ts
from attnscale.tasks import losses


def dropout_key(seed: int, step):
  """Dropout randomness is a function of (seed, step): resumable without RNG state."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 1), step)


def make_train_step(graphdef, task, run, state_shardings, batch_sharding, *,
                    attn_metrics: bool | None = None, optimizer=None):
  """The jitted (state, batch) -> (state, metrics) step of one run, state donated.

  Args:
    graphdef: the model's structure (`train_state.create_state`).
    task: the `attnscale.tasks.Task` whose loss is minimised.
    run: the run's `RunConfig` (or a ConfigDict, read by `run_config.of`); its
      `hparams` (seed, rates, thresholds) are folded in as constants.
    state_shardings, batch_sharding: the layouts jit compiles for.
    attn_metrics: whether the step returns the attention metrics; None = the
      config's `attn_metrics` (the loop builds both programs and runs the
      metrics one only on the steps it logs).
    optimizer: the run's `optimizers.Optimizer` at its own numbers, when the start
      built it (`startup.Start.optimizer`); None builds it here.

  Returns:
    The step. Its metrics: "loss", "grad_norm", "lr" (of this step) and
    "last_losses" (the state's window after this step, for `loss_last20`); with
    `config.attn_metrics`, "attn_max_logit" and "attn_entropy" ([L, N]: layer x
    query head, over this step's real queries, `attention_health`); with
    `config.qk_clip` > 0, "attn_clipped_heads" (how many heads QK-clip rescaled);
    for a task whose loss is a softmax over output logits (its sums give
    `losses.output_sums`), "out_max_logit" and "out_log_z" (the step's largest
    output logit and mean log Z), and with `config.z_loss` > 0 "z_loss" (the term
    added to the loss); "loss" is then the cross-entropy alone.
  """
  run = run_config.of(run)
  # The numbers are constants here, so the optimizer built at them once serves the step.
  optimizer = optimizers.build(run, run.hparams) if optimizer is None else optimizer
  step_fn = train_step_fn(graphdef, task, run, attn_metrics=attn_metrics, optimizer=optimizer)
  hparams = run.hparams
  train_step = under_mesh(batch_sharding.mesh)(lambda state, batch: step_fn(state, batch, hparams))
  return jax.jit(train_step, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, None), donate_argnums=0)


def train_step_fn(graphdef, task, run, *, attn_metrics: bool | None = None,
                  optimizer=None):
  """The train step as a plain function (not jitted): `step(state, batch, hparams)`.

  `hparams`: the run's traced fields (`RunConfig.hparams`: seed, learning rates, weight decay,
  clipping thresholds, z-loss coefficient), from which the step builds its optimizer
  and schedule (`optimizers.build`, once), dropout key, QK-clip threshold and z-loss
  term. `make_train_step` passes the config's Python numbers (`RunConfig.hparams`:
  constants, folded into a single run's program); a packed sweep
  (`attnscale.runtime.packed`) vmaps the step over R runs with the numbers as
  arrays, so runs that differ only in those share one program. `run` as
  `make_train_step`'s. `optimizer`: built already at numbers that are constants (a
  single run's); None: built in the step from `hparams` (a pack's arrays).
  """
  run = run_config.of(run)
  if attn_metrics is None:
    attn_metrics = run.attn_metrics
  clip = run.qk_clip > 0  # whether, not how much: a branch
  z_on = run.z_loss > 0  # likewise: off, the step is as it was
  accum_steps = run.grad_accum_steps
  with_stats = attn_metrics or clip  # QK-clip reads the stats even when not logged

  def train_step(state, batch, hparams):
    step = state["step"]
    seed, tau = hparams["seed"], hparams["qk_clip"]
    opt, schedule = optimizers.build(run, hparams) if optimizer is None else optimizer

    def loss_fn(params, batch, key):
      model = nnx.merge(graphdef, params)
      run = lambda m: task.loss(m, batch, key)
      if with_stats:
        (loss, sums), stats = models_base.attention_stats(model, run)
      else:
        (loss, sums), stats = run(model), None
      if z_on:  # PaLM's z-loss (attnscale/tasks/losses.py): + coef * mean_t (log Z_t)^2
        loss = loss + hparams["z_loss"] * z_term(sums)
      return loss, ((sums, stats) if with_stats else sums)

    (loss, aux), grads = loss_and_grads(loss_fn, state["params"], batch,
                                        dropout_key(seed, step), accum_steps)
    sums = aux[0] if with_stats else aux
    out = {}
    if "max_logit" in sums:  # the output logits' health, on every run
      out = {"out_max_logit": sums["max_logit"], "out_log_z": sums["log_z_sum"] / _count(sums)}
    if z_on:  # the loss logged (and in loss_last20) is the cross-entropy alone
      out["z_loss"] = hparams["z_loss"] * z_term(sums)
      loss = sums["loss_sum"] / _count(sums)
    health = {}
    if with_stats:
      health = attention_health(aux[1], task.attention_masks(batch)[1])
    # A model whose backward runs at a fixed scale (the unit variant's unit-scaled
    # loss) hands the optimizer the true gradient: divided back here, in float32.
    grad_scale = nnx.merge(graphdef, state["params"]).loss_grad_scale(
        batch["targets"].size // accum_steps)  # each micro-batch's backward ran at its own
    if grad_scale != 1.0:
      grads = jax.tree.map(lambda g: g / grad_scale, grads)
    updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
    last_losses = ts.push_loss(state["last_losses"], loss)
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": loss, "grad_norm": _global_norm(grads), "lr": schedule(step),
               "last_losses": last_losses, **out}
    if attn_metrics:
      metrics.update(health)
    if clip:
      # After the update, from this step's (pre-update) largest logits.
      model = nnx.merge(graphdef, params)
      factor_LN = models_base.qk_clip(model, health["attn_max_logit"], tau)
      params = nnx.state(model, nnx.Param)
      metrics["attn_clipped_heads"] = jnp.sum(factor_LN < 1.0)
    new_state = {"step": step + 1, "params": params, "opt_state": opt_state,
                 "last_losses": last_losses}
    return new_state, metrics

  return train_step


def z_term(sums) -> jax.Array:
  """mean_t (log Z_t)^2 of a batch from its loss sums (`losses.output_sums`)."""
  if "z_sum" not in sums:
    raise ValueError("config.z_loss > 0 needs a task whose loss is a softmax over output "
                     "logits (its loss sums give z_sum: attnscale/tasks/losses.py); use "
                     "config.z_loss=0")
  return sums["z_sum"] / _count(sums)


def _count(sums) -> jax.Array:
  return jnp.maximum(sums["count"], 1.0)


def loss_and_grads(loss_fn, params, batch, key, accum_steps: int = 1):
  """((loss, aux), grads) of `loss_fn(params, batch, key)` over `batch`, reached in
  `accum_steps` micro-batches (gradient accumulation); the one-batch value when 1.

  Micro-batch m holds rows m, m + A, m + 2A, ... (A = accum_steps): each device's
  rows of the batch split evenly between the micro-batches, so no row moves between
  devices. The micro-batches run one after another (`jax.lax.scan`): activations
  are held for one micro-batch at a time. The task's loss is a mean over its
  (weighted) targets, so each micro-batch's loss and gradient weigh by its share of
  the targets (aux's "count"; equal shares without one): the result equals the
  one-batch step's up to float rounding. Scalar aux (the loss sums) add, or take the
  max (`losses.MAX_SUMS`: the largest output logit); aux with a batch axis (the
  attention statistics) come back with their rows in batch order.
  Micro-batch m's dropout key is `key` folded with m (with dropout the masks differ
  from the one-batch step's; the expectation does not).
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    return grad_fn(params, batch, key)

  def split(x_B):  # [B, ...] -> [A, B / A, ...], micro-batch m = rows m::A
    x_bA = x_B.reshape(x_B.shape[0] // accum_steps, accum_steps, *x_B.shape[1:])
    return jnp.swapaxes(x_bA, 0, 1)

  def micro_step(carry, xs):
    m, micro_batch = xs
    (loss, aux), grads = grad_fn(params, micro_batch, jax.random.fold_in(key, m))
    sums = aux[0] if isinstance(aux, tuple) else aux
    count = sums.get("count", jnp.float32(1.0))
    grads = jax.tree.map(lambda acc, g: acc + g * count, carry[1], grads)
    return (carry[0] + loss * count, grads, carry[2] + count), aux

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss_x_count, grads_x_count, count), aux_A = jax.lax.scan(
      micro_step, (jnp.float32(0.0), zeros, jnp.float32(0.0)),
      (jnp.arange(accum_steps), jax.tree.map(split, batch)))
  count = jnp.maximum(count, 1e-30)  # no target at all: 0 / 0 would be NaN

  def merge(path, x_A):  # scalars: summed (or max) over micro-batches; rows: in batch order
    if x_A.ndim == 1:
      is_max = getattr(path[-1], "key", None) in losses.MAX_SUMS
      return (jnp.max if is_max else jnp.sum)(x_A, axis=0)
    x_bA = jnp.swapaxes(x_A, 0, 1)
    return x_bA.reshape(x_bA.shape[0] * accum_steps, *x_bA.shape[2:])

  grads = jax.tree.map(lambda g: (g / count).astype(g.dtype), grads_x_count)
  return (loss_x_count / count, jax.tree_util.tree_map_with_path(merge, aux_A)), grads


def attention_health(stats, query_mask_BT) -> dict[str, jax.Array]:
  """Per layer and head [L, N]: "attn_max_logit", the largest logit over the real
  queries, and "attn_entropy", their mean entropy (`AttentionStats`' definitions,
  the diagnostics'). `query_mask_BT` (True = a real token; None = all) keeps padded
  queries out, as `attnscale.evaluation.diagnostics` does."""
  B, T, _ = stats[0].max_logit_BTN.shape
  w_BT = (jnp.ones((B, T)) if query_mask_BT is None
          else jnp.broadcast_to(query_mask_BT, (B, T)).astype(jnp.float32))
  real_BT1 = w_BT[:, :, None] > 0
  count = jnp.maximum(jnp.sum(w_BT), 1.0)
  max_LN = jnp.stack([jnp.max(jnp.where(real_BT1, s.max_logit_BTN, -jnp.inf), axis=(0, 1))
                      for s in stats])
  entropy_LN = jnp.stack([jnp.sum(s.entropy_BTN * w_BT[:, :, None], axis=(0, 1)) / count
                          for s in stats])
  return {"attn_max_logit": max_LN, "attn_entropy": entropy_LN}


def make_layer_stats(graphdef, task, run, mesh, *, packed: bool = False):
  """The jitted (params, batch) -> per layer, the diagnostics' sink and activation
  statistics (`attnscale.models.layer_stats`, eval.py's definitions) of a deterministic
  forward pass over the batch's first config.sink_metrics_rows rows (all of them
  when fewer), with the task's masks (`task.attention_masks`: padded keys and
  queries excluded, as `task_attention_stats`); None when config.sink_metrics_rows
  is 0. `packed`: over a pack's leading axis K (params and batch), vmapped.

  Per layer: sink_rate (mean weight on the first key), sink_heads (the share of
  heads whose mean weight on it exceeds 0.3: Gu et al. 2024, arXiv 2410.10781),
  max_act, median_act and act_ratio = max |x| / median |x| of the residual stream
  the block writes (Sun et al. 2024, arXiv 2402.17762), kurtosis, ... and "heads".
  No gradient, no dropout, no RNG: the loop runs it on the state after a logged
  step and its batch, and training is unchanged. Its memory is the reference
  path's [rows, N, T, T] attention weights per layer. Replicated, for every
  process to read.
  """
  rows = run_config.of(run).sink_metrics_rows
  if rows == 0:
    return None

  def stats(params, batch):
    batch = {k: v[:rows] for k, v in batch.items()}
    mask, query_mask_BT = task.attention_masks(batch)
    return layer_stats.layer_stats(nnx.merge(graphdef, params), batch["inputs"], mask,
                                   query_mask_BT, _query_groups(task, batch))

  return jax.jit(under_mesh(mesh)(jax.vmap(stats) if packed else stats),
                 out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def under_mesh(mesh):
  """Traces the decorated step under `mesh` (its abstract form: no devices needed)."""
  def wrap(fn):
    def traced(*args):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return fn(*args)
    return traced
  return wrap


def _global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def make_eval_step(graphdef, task, param_shardings, batch_sharding):
  """The jitted (params, batch) -> the task's loss sums ("loss_sum", "count", ...)."""
  @under_mesh(batch_sharding.mesh)
  def eval_step(params, batch):
    _, sums = task.loss(nnx.merge(graphdef, params), batch)
    return sums

  return jax.jit(eval_step, in_shardings=(param_shardings, batch_sharding))


def global_batch(local_batch: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """Assembles each process's rows into global arrays laid out as `sharding`.

  `train_state.batch_sharding`: rows on every device, process p's devices
  holding global rows [p * b, (p + 1) * b), which is where
  `make_array_from_process_local_data` puts process p's b rows.
  """
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in local_batch.items()}


def evaluate_sums(eval_step, params, batches: Iterable[dict[str, np.ndarray]],
                  sharding) -> dict[str, float]:
  """The task's loss sums ("loss_sum", "count", ...) added over `batches`
  (`losses.add_sums`: the max of `MAX_SUMS`)."""
  totals = {}
  for batch in batches:
    sums = jax.device_get(eval_step(params, global_batch(batch, sharding)))
    sums = {k: float(v) for k, v in sums.items()}
    totals = losses.add_sums(totals, sums) if totals else sums
  return totals


def evaluate(eval_step, params, batches: Iterable[dict[str, np.ndarray]], sharding) -> float:
  """Mean loss per target token over `batches` (sums, so padding weighs 0)."""
  sums = evaluate_sums(eval_step, params, batches, sharding)
  return sums.get("loss_sum", 0.0) / max(sums.get("count", 0.0), 1.0)


def _query_groups(task, batch):
  """The task's query groups of `batch` (`Task.query_groups`), or None: none, or a
  stand-in task without the method."""
  groups = getattr(task, "query_groups", None)
  return (groups(batch) or None) if groups else None
