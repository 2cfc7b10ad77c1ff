"""The run's optimizer: Adam, AdamW or Muon on a learning-rate schedule, gradient
clipping, and muP's per-parameter learning-rate multipliers.

`build(run, hparams)` is the one place a run's optimizer and its schedule are built
(the train step, `train_state.create_state`'s initial optimizer state, `compile.py`).
`hparams` are the run's traced fields (`RunConfig.hparams`): the config's Python numbers for a
single run (`RunConfig.hparams`: folded in as constants), or
traced arrays in a packed step (attnscale/runtime/packing.py says why), so the
learning rate, weight decay and clipping threshold may differ between the runs of
one compiled program while the optimizer state keeps one layout.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from attnscale.config import run as run_config
from attnscale.models import ModelConfig, mup


class Optimizer(NamedTuple):
  """A run's optimizer and the learning-rate schedule it runs on (the train step
  logs `schedule(step)`, the rate the update used)."""

  tx: optax.GradientTransformation
  schedule: optax.Schedule


def learning_rate_schedule(run, hparams) -> optax.Schedule:
  """Linear warm-up to the learning rate, then constant or cosine decay.

  The rates come from `hparams` (`RunConfig.hparams`, or a packed step's traced
  arrays); the schedule's form (warm-up steps, decay length) from the `RunConfig`
  `run` (or a ConfigDict, read by `run_config.of`).
  """
  config = run_config.of(run)
  lr = hparams["learning_rate"]
  warmup = optax.linear_schedule(0.0, lr, max(config.warmup_steps, 1))
  if config.lr_schedule == "constant":
    after = optax.constant_schedule(lr)
  else:  # cosine down to min_learning_rate at num_train_steps (nanoGPT's lr_decay_iters)
    decay_steps = max(config.num_train_steps - config.warmup_steps, 1)
    after = optax.cosine_decay_schedule(
        lr, decay_steps, alpha=hparams["min_learning_rate"] / lr)
  if config.warmup_steps == 0:
    return after
  return optax.join_schedules([warmup, after], [config.warmup_steps])


# Moonlight's update RMS: 0.2 matches AdamW's typical update RMS (Liu et al. 2025).
MOONLIGHT_RMS = 0.2


def build(run: run_config.RunConfig, hparams) -> Optimizer:
  """The run's optimizer: Adam, AdamW or Muon on the schedule, clipping, muP's multipliers.

  `hparams`: the traced fields' values: `run.hparams` (the config's numbers), or a
  packed step's arrays (its optimizer state has the same layout).
  """
  config, cfg = run, run.model
  schedule = learning_rate_schedule(run, hparams)
  # optax's default epsilon; the depth rule scales it (mup.adam_eps_mult, 1 otherwise).
  eps = {} if not cfg.depth_alpha else {"eps": 1e-8 * mup.adam_eps_mult(cfg)}
  if config.optimizer == "adam":
    opt = optax.adam(schedule, b1=config.b1, b2=config.b2, **eps)
  else:
    opt = optax.adamw(schedule, b1=config.b1, b2=config.b2, **eps,
                      weight_decay=hparams["weight_decay"], mask=_decay_mask)
  if config.optimizer == "muon":
    opt = muon(run, schedule, opt, hparams["weight_decay"])
  if mup.has_lr_multipliers(cfg):
    # After Adam(W): the whole step, decay included, at the group's lr (MuAdamW's).
    opt = optax.chain(opt, scale_by_lr_multipliers(cfg))
  if config.grad_clip > 0:
    opt = optax.chain(optax.clip_by_global_norm(hparams["grad_clip"]), opt)
  return Optimizer(opt, schedule)


def make_optimizer(config) -> optax.GradientTransformation:
  """The transformation alone, at the config's own numbers, for callers that hold a
  ConfigDict (a test, a benchmark) or need only the optimizer state's layout."""
  run = run_config.of(config)
  return build(run, run.hparams).tx


def _decay_mask(params):
  # nanoGPT decays only the matrices and embeddings (ndim >= 2), never gains.
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def is_muon_matrix(path, p) -> bool:
  """Whether Muon trains the parameter at `path`: the hidden matrices (`mup.is_hidden`,
  the Dense layers' 2-D kernels); embeddings, the tied readout, gains and biases are
  AdamW's (modded-nanogpt's and Moonlight's split)."""
  return mup.is_hidden(path) and p.ndim == 2


def muon(run: run_config.RunConfig, schedule, adamw: optax.GradientTransformation,
         weight_decay) -> optax.GradientTransformation:
  """Muon on the hidden matrices, `adamw` (the run's Adam(W)) on everything else.

  Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"
  (kellerjordan.github.io/posts/muon; modded-nanogpt): the Nesterov momentum
  M <- beta M + G (beta = 0.95, optax's bias-corrected EMA form) is orthogonalised by
  5 quintic Newton-Schulz steps X <- a X + (b A + c A^2) X, A = X X^T, from
  X0 = M / ||M||_F, (a, b, c) = (3.4445, -4.7750, 2.0315) (`scale_by_muon`: optax.contrib's
  state and momentum, its iteration without the transposes). The update O (singular values
  about 1) is then scaled by `config.muon_lr_rule`, for W of shape (fan_in, fan_out):

      moonlight       O x 0.2 sqrt(max(fan_in, fan_out)): update RMS 0.2, AdamW's, so
                      one learning rate serves both (Liu et al. 2025, "Muon is
                      Scalable for LLM Training", arXiv 2502.16982, section 2.2; Kimi)
      modded_nanogpt  O x sqrt(max(1, fan_out / fan_in)) (modded-nanogpt; Bernstein's
                      spectral-norm width rule: the update's RMS->RMS norm is 1)

  then decayed (decoupled, W x weight_decay, as Moonlight) and multiplied by the
  schedule's learning rate. The Adam(W) branch runs at `config.muon_adam_lr_mult` x
  the schedule's rate (its decoupled decay too, as AdamW's is): 1, one rate for both,
  is Moonlight's and Kimi's; modded-nanogpt tunes the embedding and readout rates
  apart. `config.muon_adam_lr_base_width` = B > 0 multiplies it by B / model.width as
  well: Adam's 1/width rule for that branch, at Muon's rate at width B. Both rules
  read the shape (no muP multiplier on top);
  whether the best learning rate then transfers across width is measured, not
  assumed, in docs/experiments/transfer.md (under `moonlight` it falls, while the
  loss stays flat over several octaves). Built from optax.contrib's pieces with
  `optax.partition` (not `optax.contrib.muon`, whose Adam branch is Nesterov and
  shares Muon's epsilon): the non-matrix branch is exactly the run's Adam(W). The
  opt_state layout depends on the parameters' shapes only, not on the traced
  learning rate or decay.
  """
  rule = run.muon_lr_rule
  consistent_rms = MOONLIGHT_RMS if rule == "moonlight" else None
  matrices = optax.chain(
      scale_by_muon(),
      scale_by_muon_shape(consistent_rms),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(schedule))
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, p: "muon" if is_muon_matrix(path, p) else "adam", params)
  adam_mult = run.muon_adam_lr_mult
  if run.muon_adam_lr_base_width:  # Adam's 1/width, equal at the base
    adam_mult *= run.muon_adam_lr_base_width / run.model.width
  if adam_mult != 1:  # only then: Muon checkpoints at 1 keep their opt_state layout
    adamw = optax.chain(adamw, optax.scale(adam_mult))
  return optax.partition({"muon": matrices, "adam": adamw}, labels)


def newton_schulz(m_io: jax.Array, coeffs: jax.Array, steps: int = 5,
                  eps: float = 1e-8) -> jax.Array:
  """Jordan et al.'s quintic Newton-Schulz orthogonalisation of the matrix M (i, o):

      X0 = M / (||M||_F + eps);  X <- a X + (b A + c A^2) X,  A = X X^T   (i <= o)
                                 X <- a X + X (b A + c A^2),  A = X^T X   (i > o)

  The second line is the first on X^T (optax.contrib's `orthogonalize_via_newton_schulz`
  transposes a tall matrix instead); A is the small side's Gram matrix either way.
  Written with contractions over the long axis rather than `x.T`, because XLA:CPU
  copied every transpose (tens of ms a step at width 256, half the update's time:
  benchmarks/step_profile.py --set optimizer=muon); equal to optax's to float32
  rounding (tests/test_transfer.py)."""
  a, b, c = coeffs[0], coeffs[1], coeffs[2]
  x_io = m_io / (jnp.linalg.norm(m_io) + eps)
  wide = x_io.shape[0] <= x_io.shape[1]
  for _ in range(steps):  # unrolled, as optax's (it composes with a packed step's vmap)
    if wide:
      a_ii = jnp.einsum("io,jo->ij", x_io, x_io)
      x_io = a * x_io + (b * a_ii + c * a_ii @ a_ii) @ x_io
    else:
      a_oo = jnp.einsum("io,ip->op", x_io, x_io)
      x_io = a * x_io + x_io @ (b * a_oo + c * a_oo @ a_oo)
  return x_io


def scale_by_muon(beta: float = 0.95, steps: int = 5) -> optax.GradientTransformation:
  """`optax.contrib.scale_by_muon`'s defaults (Nesterov, bias-corrected EMA momentum,
  Frobenius preconditioning, its coefficients), with `newton_schulz` as the
  iteration. Its state is optax's own (`MuonState`: count, mu, ns_coeffs), so
  checkpoints written by optax's transformation restore into this one."""
  base = optax.contrib.scale_by_muon(beta=beta, ns_steps=steps)

  def update(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, beta, 1)
    count = optax.safe_increment(state.count)
    mu_hat = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g,
                          optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                          optax.tree.bias_correction(updates, beta, count))
    ortho = jax.tree.map(lambda m: newton_schulz(m, state.ns_coeffs.astype(m.dtype), steps),
                         mu_hat)
    return ortho, state._replace(count=count, mu=mu)

  return optax.GradientTransformation(base.init, update)


def muon_shape_factor(shape, consistent_rms: float | None) -> float:
  """Muon's per-matrix factor for W of `shape` (fan_in, fan_out): consistent_rms
  sqrt(max(fan_in, fan_out)) (Moonlight), or sqrt(max(1, fan_out / fan_in)) when None
  (modded-nanogpt); optax.contrib's `scale_by_shape` formulas."""
  fan_in, fan_out = shape
  if consistent_rms is not None:
    return consistent_rms * max(fan_in, fan_out) ** 0.5
  return max(1.0, fan_out / fan_in) ** 0.5


def scale_by_muon_shape(consistent_rms: float | None) -> optax.GradientTransformation:
  """Multiplies each orthogonalised update by `muon_shape_factor` (stateless)."""

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u: u * muon_shape_factor(u.shape, consistent_rms),
                        updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_lr_multipliers(cfg: ModelConfig) -> optax.GradientTransformation:
  """Multiplies each parameter's update by its learning-rate multiplier
  (`mup.lr_multipliers`: 1/m on hidden matrices under mup, r^(alpha - 1) on block
  parameters under the depth rule, 1 elsewhere). Stateless, so a
  checkpoint's opt_state holds nothing more than Adam's."""

  def update(updates, state, params=None):
    del params
    mults = mup.lr_multipliers(cfg, updates)
    return jax.tree.map(lambda u, m: u if m == 1.0 else u * jnp.asarray(m, u.dtype),
                        updates, mults), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
