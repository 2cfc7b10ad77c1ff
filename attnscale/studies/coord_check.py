"""Coordinate check: every layer's activation scale against width (sp against mup)
or against depth (sp against the depth rule).

muP's standard diagnostic (Yang et al. 2022, "Tensor Programs V", arXiv
2203.03466, section 7 and figure 5; microsoft/mup's `get_coord_data`): train the
same model at several widths for a few steps (same seed, data and learning rate)
and record, after each step, the size of each layer's output. Under a
parameterisation that transfers (mup) every curve is flat in width; under sp the
outputs that the optimizer moves (the logits, the attention logits) grow with it.

The size is the mean absolute value of the coordinates, mean |x| over batch,
positions and features (what mup's `get_coord_data` records as "l1"), of:

    embedding    the residual stream's start (token + position embeddings)
    attn_logits  layer l's attention logits s q.k over the visible (causal) pairs
    attn_out     layer l's attention branch (after the output projection)
    mlp_out      layer l's MLP branch
    residual     the residual stream after the last block (before the final LayerNorm)
    logits       the output logits (after mup's readout multiplier)

measured on the first training batch after t = 0 (init), 1, ..., steps updates.
The branches are read through the model's seams (`Block.attention_call`,
`Block.attn_input`, `Block.residual_branch`, the block itself), so the programs
trained are train.py's own: pre-LN standard transformers only. A branch is what
it adds to the residual stream (times r^-alpha under the depth rule; the MLP
branch is block(x) - x - attn).

The depth check (`--depths`, CompleteP's figure 7: Dey et al. 2025, arXiv
2505.01618) trains the same model at several depths instead, sp against the
depth rule (`model.depth_alpha` 1, CompleteP, and 1/2, depth-muP), with the
per-layer kinds averaged over each model's layers. Under a rule that transfers
across depth the curves are flat in depth.

    python -m attnscale.studies coord_check --config=configs/shakespeare_char.py:preset=graphcore_cpu \\
        --widths=32,64,128,256,512 --steps=4 --out=docs/results/width
    python -m attnscale.studies coord_check --depths=2,4,8,16,32 --steps=4 --out=docs/results/depth

Dimension legend: B batch, T sequence, D width, N heads, S keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import reporting
from attnscale.studies import registry

# The axis -> (the model field it sets, {parameterisation: its model overrides}).
AXES = {
    "width": ("width", {"sp": {"parameterization": "sp"}, "mup": {"parameterization": "mup"}}),
    "depth": ("num_layers", {"sp": {"depth_alpha": 0.0}, "complete_p": {"depth_alpha": 1.0},
                             "depth_mup": {"depth_alpha": 0.5}}),
}
PARAMETERIZATIONS = tuple(AXES["width"][1])
KINDS = ("embedding", "attn_logits", "attn_out", "mlp_out", "residual", "logits")
PER_LAYER = ("attn_logits", "attn_out", "mlp_out")


def load_config(spec: str):
  """`path.py[:arg]` -> that file's `get_config(arg)` (as train.py's --config reads it)."""
  path, *arg = spec.split(":", 1)
  module_spec = importlib.util.spec_from_file_location("_coord_check_config", path)
  if module_spec is None:
    raise ValueError(f"--config {path} is not a Python config file")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*arg)


def activation_scales(model, tokens_BT) -> dict[str, float]:
  """mean |x| of every recorded output (`KINDS`; per-layer ones as NAME_l) on `tokens_BT`."""
  import jax.numpy as jnp

  from attnscale.core.attention import attention_weights

  mean_abs = lambda x: jnp.mean(jnp.abs(x.astype(jnp.float32)))
  x_BTD = model.embed_tokens(tokens_BT)
  out = {"embedding": mean_abs(x_BTD)}
  for layer, block in enumerate(model.blocks):
    call = block.attention_call(x_BTD)
    logits_BNTS, _ = attention_weights(call.q_BTNH, call.k_BSKH, scale_fn=call.scale_fn,
                                       is_causal=call.is_causal)
    visible_BNTS = jnp.isfinite(logits_BNTS)
    out[f"attn_logits_{layer}"] = (jnp.sum(jnp.where(visible_BNTS, jnp.abs(logits_BNTS), 0.0))
                                   / jnp.sum(visible_BNTS))
    attn_BTD = block.residual_branch(block.attn(block.attn_input(x_BTD)))
    after_BTD = block(x_BTD)
    out[f"attn_out_{layer}"] = mean_abs(attn_BTD)
    out[f"mlp_out_{layer}"] = mean_abs(after_BTD - x_BTD - attn_BTD)
    x_BTD = after_BTD
  out["residual"] = mean_abs(x_BTD)
  out["logits"] = mean_abs(model.logits(x_BTD))
  return out


def trajectory(config, steps: int) -> list[dict[str, float]]:
  """`activation_scales` on the first training batch after 0, 1, ..., `steps` train.py steps."""
  import jax
  from flax import nnx

  from attnscale.config import run as run_config
  from attnscale.runtime import startup
  from attnscale.runtime import steps as steps_lib

  run = run_config.of(config)
  cfg = run.model
  if cfg.variant != "standard" or cfg.ln_position != "pre":
    raise ValueError("coord_check needs model.variant='standard' and model.ln_position='pre', "
                     f"got {cfg.variant!r}, {cfg.ln_position!r}")
  s = startup.start(run)
  task, graphdef, batch_sharding = s.task, s.graphdef, s.batch_sharding
  state = startup.init_state(s)
  train_step = steps_lib.make_train_step(graphdef, task, s.run, s.shardings, batch_sharding,
                                         optimizer=s.optimizer)
  measure = jax.jit(lambda params, tokens_BT: activation_scales(nnx.merge(graphdef, params),
                                                                tokens_BT))
  tokens_BT = steps_lib.global_batch(task.train_batch(0), batch_sharding)["inputs"]
  scales = [measure(state["params"], tokens_BT)]
  for step in range(steps):
    state, _ = train_step(state, steps_lib.global_batch(task.train_batch(step), batch_sharding))
    scales.append(measure(state["params"], tokens_BT))
  return [{k: float(v) for k, v in jax.device_get(s).items()} for s in scales]


@dataclasses.dataclass
class CoordCheckResult:
  """scales[parameterization][size] = the trajectory (one dict per step 0..steps);
  sizes are widths or depths (`axis`)."""

  sizes: tuple[int, ...]
  steps: int
  scales: dict[str, dict[int, list[dict[str, float]]]]
  axis: str = "width"

  @property
  def column_prefix(self) -> str:
    return "w" if self.axis == "width" else "L"

  def quantities(self) -> list[str]:
    """The recorded quantities (per-layer ones once, without a layer, under depth)."""
    if self.axis == "depth":  # the layers differ between depths: their mean only
      return list(KINDS)
    return list(self.scales[next(iter(self.scales))][self.sizes[0]][0])

  def value(self, parameterization: str, kind: str, size: int, step: int) -> float:
    """A quantity's scale; a per-layer kind without a layer is the mean over layers."""
    row = self.scales[parameterization][size][step]
    if kind in row:
      return row[kind]
    return float(np.mean([v for k, v in row.items()
                          if k.rsplit("_", 1)[0] == kind and k.rsplit("_", 1)[1].isdigit()]))

  def growth(self, parameterization: str, kind: str, step: int | None = None) -> float:
    """scale at the largest / at the smallest size, after `step` (default: the last) steps."""
    step = self.steps if step is None else step
    return (self.value(parameterization, kind, self.sizes[-1], step)
            / self.value(parameterization, kind, self.sizes[0], step))

  def rows(self) -> list[dict]:
    """One row per (parameterization, quantity, step): the scale at each size, and growth."""
    rows = []
    for p in self.scales:
      for q in self.quantities():
        for step in range(self.steps + 1):
          row = {"parameterization": p, "quantity": q, "step": step}
          row |= {f"{self.column_prefix}{n}": self.value(p, q, n, step) for n in self.sizes}
          row["growth"] = self.growth(p, q, step)
          rows.append(row)
    return rows


def coord_check(config, sizes: Sequence[int], steps: int,
                parameterizations: Sequence[str] | None = None,
                axis: str = "width") -> CoordCheckResult:
  """Trains `config` at each size on `axis` (width or depth, AXES) and each of its
  parameterisations for `steps` steps (its learning rate, seed and data) and
  records every layer's scale after each step."""
  field, overrides = AXES[axis]
  sizes = tuple(sorted(sizes))
  scales = {}
  for p in parameterizations or tuple(overrides):
    scales[p] = {}
    for n in sizes:
      c = config.copy_and_resolve_references()
      c.model.update({field: n, **overrides[p]})
      scales[p][n] = trajectory(c, steps)
  return CoordCheckResult(sizes, steps, scales, axis)


def plot_coord_check(r: CoordCheckResult, *, title: str = ""):
  """One panel per kind (columns) and parameterisation (rows): scale against width
  (log-log), one line per step; per-layer kinds averaged over layers."""
  fig = reporting.new_figure(3.2 * len(KINDS), 3.0 * len(r.scales))
  axes = fig.subplots(len(r.scales), len(KINDS), squeeze=False)
  for i, p in enumerate(r.scales):
    for j, kind in enumerate(KINDS):
      ax = axes[i][j]
      for step in range(r.steps + 1):
        ax.plot(r.sizes, [r.value(p, kind, n, step) for n in r.sizes],
                label=f"t={step}", **reporting.style(step))
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      what = kind + (" (mean over layers)" if kind in PER_LAYER else "")
      reporting.label_axes(ax, xlabel=r.axis, ylabel="mean |x|", title=f"{p}: {what}")
      if j:
        ax.get_legend().remove()
  if title:
    fig.suptitle(title)
  return fig


def parse_widths(text: str, flag: str = "--widths") -> tuple[int, ...]:
  """`32,64,128` -> (32, 64, 128); one-line ValueError naming `flag` otherwise."""
  try:
    sizes = tuple(int(w) for w in text.split(","))
  except ValueError:
    sizes = ()
  if len(sizes) < 2 or min(sizes) < 1:
    raise ValueError(f"{flag} must be two or more positive ints like 32,64,128, got {text!r}")
  return sizes


def run_cli(args) -> tuple[list[str], list[str]]:
  """Writes coord_check.png/.csv/.md (coord_check_depth.* with --depths); returns
  (paths, notes)."""
  axis = "depth" if getattr(args, "depths", None) else "width"
  try:
    config = load_config(args.config)
    sizes = (parse_widths(args.depths, "--depths") if axis == "depth"
             else parse_widths(args.widths))
    if args.steps < 1:
      raise ValueError(f"--steps must be >= 1, got {args.steps}")
    config.seed = args.seed
    r = coord_check(config, sizes, args.steps, axis=axis)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  m = config.model
  lr = f"{config.learning_rate:g}" + (f" = 2^{math.log2(config.learning_rate):g}"
                                      if math.log2(config.learning_rate).is_integer() else "")
  shape = (f"width {m.width}, {m.num_heads} heads, base depth {m.base_depth}" if axis == "depth"
           else f"{m.num_layers} layers, {m.num_heads} heads, mup's base_width {m.base_width}")
  col = r.column_prefix
  notes = [f"{args.config}: {shape}, seq {config.seq_len}, batch {config.batch_size}, "
           f"{config.optimizer} at lr {lr} ({config.lr_schedule}, warm-up "
           f"{config.warmup_steps}), seed {config.seed}.",
           "Scale: mean |x| of each output on the first training batch after `step` updates "
           "(0 = init); per-layer quantities end in the layer's index"
           + (" (under depth: their mean over layers)" if axis == "depth" else "")
           + f"; {col}<{axis}> columns; growth = {col}{sizes[-1]} / {col}{sizes[0]}.",
           f"Growth after the last step ({', '.join(r.scales)}): " + "; ".join(
               f"{k} " + ", ".join(f"{r.growth(p, k):.2f}" for p in r.scales) for k in KINDS)
           + " (per-layer kinds: mean over layers)."]
  name = "coord_check" if axis == "width" else "coord_check_depth"
  fig = plot_coord_check(r, title=f"Coordinate check against {axis} ({args.config}, "
                                  f"{args.steps} steps)")
  paths = [reporting.save_figure(fig, args.out, name)]
  paths += reporting.write_tables(r.rows(), args.out, name,
                                  title=f"Coordinate check: activation scale against {axis}",
                                  notes=notes)
  return paths, notes


def add_arguments(p) -> None:
  g = p.add_argument_group("coord_check (trains: never part of all)")
  g.add_argument("--config", default="configs/shakespeare_char.py:preset=graphcore_cpu",
                 help="the train.py config (FILE.py[:ARG]) trained at each width")
  g.add_argument("--widths", default="32,64,128,256,512",
                 help="comma-separated model widths (num_heads must divide each)")
  g.add_argument("--depths", default=None,
                 help="comma-separated depths (num_layers): the depth check, sp against "
                      "the depth rule (model.depth_alpha 1 and 1/2), instead of --widths")
  g.add_argument("--steps", type=int, default=4, help="training steps recorded at each size")


# Trains models: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, arguments=add_arguments)
