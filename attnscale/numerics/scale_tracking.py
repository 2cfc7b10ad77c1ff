"""Scale tracking: every named tensor's scale, and what each format would do to it, in one step.

    report = scale_tracking.track(model, loss_fn)        # one forward + backward
    report.rows()                                        # a table, one row per tensor
    report.flagged(threshold=0.01)                       # what the run's own format loses

For every matrix product's input ("x") and output ("y"), the attention inputs
("q", "k", "v"), every parameter, and the gradient of each of these, it records
the std, the absolute max and, for each format in `FORMATS` (fp16, bf16, e4m3,
e5m2), the fraction of elements that underflow (nonzero, and round to zero),
that land among the subnormals (nonzero, below the smallest normal: fewer
significant bits), and that overflow (|x| > the largest finite value: saturate
or become inf). This is unit-scaling's `track_scales` and scale analysis
(Graphcore, `unit_scaling.transforms.track_scales`, `unit_scaling.analysis.plot`)
for JAX; `attnscale.studies.precision.plot_scales` draws it.

How the tensors are found. The products (`attnscale.numerics.layers`) and the attention
hook (`attnscale.numerics.precision.attention_inputs`) call `precision.tap(x, label)`,
the identity unless an observer is installed. `track` installs one that
(1) names the tensor by the innermost `nnx.Module` on the Python call stack
(its path in the model, e.g. "blocks.0.attn.q_proj", plus the method when it is
not `__call__`, e.g. "logits") and the label, numbering repeated products at
one site ("blocks.0.mlp.x", "blocks.0.mlp#1.x" for the unit model's up and down
projections); (2) keeps the forward value; (3) adds a zero "probe" array, so
that the gradient with respect to the probe is the gradient arriving at the
tensor. One `jax.eval_shape` pass finds the names and shapes, one jitted
`jax.value_and_grad` computes everything; nothing in the model changes, and the
stack is only read while tracing.

What the numbers mean in each model.dtype. The tensors are recorded as the run
computes them: under float16 they are float16 values, and a gradient that fp16
flushed is already an exact zero (the `zero` column), so `flagged` reads zeros
for tensors stored in a low-precision dtype and `underflow[format]` for the
others. Under fp8 (simulated in float32) each gradient "y" is recorded before
its e5m2 rounding and each "x", "q", "k", "v" before its e4m3 rounding, so
`underflow["e5m2"]` of a "y" gradient is exactly the fraction the simulation
flushes (with model.fp8_scaling="none"). The unit model's gradients are at its
backward's scale (`Model.loss_grad_scale`: the loss's gradient made unit at the
logits), before the train step divides the parameters' gradients back.

Dimension legend: none (tensors of any shape, flattened for statistics).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnscale.numerics import precision

Array = jax.Array
FORMATS = ("float16", "bfloat16", "e4m3", "e5m2")
# Which format a run's own tensors go through: (forward tensors, gradients).
RUN_FORMATS = {"float32": None, "bfloat16": ("bfloat16", "bfloat16"),
               "float16": ("float16", "float16"), "fp8": ("e4m3", "e5m2")}


@dataclasses.dataclass(frozen=True)
class TensorScale:
  """One tensor's statistics.

  Attributes:
    name: where it is: a module path and label ("blocks.0.attn.q_proj.x",
      "blocks.1.attn.q", "logits.y") or a parameter path ("embed.embedding").
    role: "activation" or "weight".
    direction: "forward" (the value) or "backward" (the gradient arriving at it).
    dtype: the dtype it was computed in.
    size: number of elements.
    std, absmax: of its elements (float32 or wider).
    zero: fraction of elements exactly zero.
    underflow, subnormal, overflow: per format name, fractions of all elements
      that are nonzero and round to zero; nonzero and below the smallest normal
      without rounding to zero; above the largest finite value.
    underflow_scaled: per format, the fraction that rounds to zero after
      per-tensor scaling (`precision.per_tensor_scale`: the tensor's amax moved
      just below the format's max), what model.fp8_scaling="per_tensor" loses.
  """

  name: str
  role: str
  direction: str
  dtype: str
  size: int
  std: float
  absmax: float
  zero: float
  underflow: dict[str, float]
  subnormal: dict[str, float]
  overflow: dict[str, float]
  underflow_scaled: dict[str, float]

  @property
  def label(self) -> str:
    return f"{self.name} (grad)" if self.direction == "backward" else self.name


@dataclasses.dataclass(frozen=True)
class ScaleReport:
  """`track`'s result: the loss and every tensor, in order of first use.

  Attributes:
    dtype: the model's model.dtype ("float32", "float16", "fp8", ...).
    loss: the loss of the tracked step.
    tensors: forward tensors, then their gradients, then weights and theirs.
    formats: the formats the fractions are computed for.
    fp8_scaling: the model's model.fp8_scaling ("none" or "per_tensor").
  """

  dtype: str
  loss: float
  tensors: list[TensorScale]
  formats: tuple[str, ...] = FORMATS
  fp8_scaling: str = "none"

  def lost(self, t: TensorScale) -> list[tuple[str, float]]:
    """(what, fraction) that the run's own format loses of tensor t ([] for float32).

    A tensor stored in a low-precision dtype: its fraction of exact zeros
    (flushed, or zero to begin with). One computed in float32 (fp8 simulation):
    the fraction its format flushes (after per-tensor scaling when the run
    uses it) and, unscaled, the fraction that overflows.
    """
    formats = RUN_FORMATS.get(self.dtype)
    if formats is None or (t.role == "weight" and t.direction == "forward"):
      return []  # parameters stay float32; their rounded copies are products' inputs
    fmt = formats[0] if t.direction == "forward" else formats[1]
    if t.dtype in ("float16", "bfloat16"):
      return [(f"zero in {t.dtype}", t.zero)]
    if self.fp8_scaling == "per_tensor":
      return [(f"underflow in {fmt} (per-tensor scaled)", t.underflow_scaled[fmt])]
    return [(f"underflow in {fmt}", t.underflow[fmt]), (f"overflow in {fmt}", t.overflow[fmt])]

  def get(self, name: str, direction: str = "forward") -> TensorScale:
    for t in self.tensors:
      if t.name == name and t.direction == direction:
        return t
    raise KeyError(f"no tensor {name!r} ({direction}) in the report")

  def rows(self) -> list[dict]:
    """One row per tensor: name, role, direction, dtype, size, std, log2_std,
    absmax, zero, and per format underflow_/subnormal_/overflow_<format>."""
    rows = []
    for t in self.tensors:
      row = {"name": t.name, "role": t.role, "direction": t.direction, "dtype": t.dtype,
             "size": t.size, "std": t.std,
             "log2_std": math.log2(t.std) if t.std > 0 else -math.inf,
             "absmax": t.absmax, "zero": t.zero}
      for kind in ("underflow", "subnormal", "overflow"):
        row.update({f"{kind}_{f}": getattr(t, kind)[f] for f in self.formats})
      rows.append(row)
    return rows

  def flagged(self, threshold: float = 0.01) -> list[tuple[TensorScale, str, float]]:
    """(tensor, what, fraction) for every tensor that its run's format damages.

    The run's formats are `RUN_FORMATS[dtype]` (forward, gradients; none for
    float32). A tensor stored in a low-precision dtype reports its fraction of
    exact zeros ("zero in <dtype>": flushed, or zero to begin with); one computed
    in float32 the fraction that its format would flush ("underflow in <fmt>")
    or overflow. Listed when the fraction exceeds `threshold`.
    """
    return [(t, what, frac) for t in self.tensors for what, frac in self.lost(t)
            if frac > threshold]

  def summary(self, threshold: float = 0.01) -> list[str]:
    """`flagged` as lines, worst first; one line saying so when nothing is."""
    flagged = sorted(self.flagged(threshold), key=lambda f: -f[2])
    if not flagged:
      return [f"model.dtype={self.dtype}: no tracked tensor loses more than "
              f"{threshold:.0%} of its elements"]
    return [f"model.dtype={self.dtype}: {len(flagged)} tensors lose more than "
            f"{threshold:.0%} of their elements"] + [
                f"  {t.label}: {frac:.1%} {what} (std 2^{math.log2(t.std):.1f})"
                if t.std > 0 else f"  {t.label}: {frac:.1%} {what} (all zero)"
                for t, what, frac in flagged]


def tensor_stats(x, formats: Sequence[str] = FORMATS) -> dict[str, Any]:
  """std, absmax, zero and the per-format fractions of one tensor, on the host (numpy).

  By comparison with each format's thresholds: round to nearest even flushes
  |x| <= min_subnormal / 2 to zero (exactly: at the tie it rounds to the even
  neighbour, 0), keeps min_subnormal / 2 < |x| < min_normal as a subnormal,
  and overflows |x| > max. (Host numpy, not jit: a hundred reductions in one
  XLA program cost more to compile than to run.)
  """
  x = np.asarray(x)
  x = x.astype(np.promote_types(x.dtype, np.float32)).ravel()
  ax = np.abs(x)
  amax = float(ax.max(initial=0.0))
  out = {"std": float(np.std(x)), "absmax": amax, "zero": float(np.mean(x == 0)),
         "underflow": {}, "subnormal": {}, "overflow": {}, "underflow_scaled": {}}
  for name in formats:
    fmt = precision.FORMATS[name]
    half_sub = fmt.min_subnormal / 2
    out["underflow"][name] = float(np.mean((ax > 0) & (ax <= half_sub)))
    scale = _per_tensor_scale(amax, fmt)
    out["underflow_scaled"][name] = float(np.mean((ax > 0) & (ax * scale <= half_sub)))
    out["subnormal"][name] = float(np.mean((ax > half_sub) & (ax < fmt.min_normal)))
    out["overflow"][name] = float(np.mean(ax > fmt.max))
  return out


def _per_tensor_scale(amax: float, fmt: precision.Format) -> float:
  """`precision.per_tensor_scale` on the host: the largest 2^e with amax 2^e <= max."""
  if not (amax > 0 and math.isfinite(amax)):
    return 1.0
  scale = 2.0**min(max(math.floor(math.log2(fmt.max / amax)), -100), 100)
  return scale / 2 if amax * scale > fmt.max else scale


class _Namer:
  """Names a tapped tensor by the innermost model module on the call stack."""

  def __init__(self, model: nnx.Module):
    self.paths = {id(m): ".".join(str(p) for p in path) for path, m in nnx.iter_modules(model)}
    self.products = collections.Counter()

  def __call__(self, label: str, depth: int) -> str:
    frame = sys._getframe(depth)
    path, method = "", "?"
    while frame is not None:
      owner = frame.f_locals.get("self")
      if owner is not None and id(owner) in self.paths:
        path, method = self.paths[id(owner)], frame.f_code.co_name
        break
      frame = frame.f_back
    site = ".".join(p for p in (path, "" if method == "__call__" else method) if p) or "model"
    if label == "x":  # "x" opens a product at this site, "y" closes it
      self.products[site] += 1
    n = self.products[site] - 1 if label in ("x", "y") else 0
    return f"{site}#{n}.{label}" if n > 0 else f"{site}.{label}"


def track(model: nnx.Module, loss_fn: Callable[[nnx.Module], Array], *,
          formats: Sequence[str] = FORMATS) -> ScaleReport:
  """One forward and backward pass of `loss_fn(model)`, every tapped tensor recorded.

  Args:
    model: an `attnscale.models.Model` (any nnx module whose products go
      through `attnscale.numerics.layers`); it is not modified.
    loss_fn: model -> scalar loss (e.g. `lambda m: task.loss(m, batch)[0]`).
    formats: names from `precision.FORMATS` to compute fractions for.

  Returns:
    A `ScaleReport`: activations, their gradients, weights and their gradients.
  """
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  cfg = getattr(model, "cfg", None)
  dtype, fp8_scaling = getattr(cfg, "dtype", "float32"), getattr(cfg, "fp8_scaling", "none")

  def forward(params, probes):
    m = nnx.merge(graphdef, params, rest)
    namer, acts = _Namer(m), {}

    def observe(x, label):
      # depth 3: _Namer.__call__ <- observe <- precision.tap <- its caller.
      name = namer(label, depth=3)
      acts[name] = x
      return x if probes is None else x + probes[name]

    with precision.observing(observe):
      loss = loss_fn(m)
    return loss, acts

  order = []  # the tensors in order of use (jit returns dicts sorted by key)

  def find(params):
    acts = forward(params, None)[1]
    order.extend(acts)
    return acts

  shapes = jax.eval_shape(find, params)

  @jax.jit
  def run(params):
    probes = {name: jnp.zeros(s.shape, s.dtype) for name, s in shapes.items()}
    (loss, acts), (grad_params, grad_probes) = jax.value_and_grad(
        forward, argnums=(0, 1), has_aux=True)(params, probes)
    return loss, acts, grad_probes, _flat(params), _flat(grad_params)

  loss, acts, grad_acts, weights, grad_weights = jax.device_get(run(params))
  tensors = []
  for role, direction, table, names in (("activation", "forward", acts, order),
                                        ("activation", "backward", grad_acts, order),
                                        ("weight", "forward", weights, list(weights)),
                                        ("weight", "backward", grad_weights, list(weights))):
    tensors += [_scale(name, role, direction, table[name],
                       tensor_stats(table[name], formats)) for name in names]
  return ScaleReport(dtype, float(loss), tensors, tuple(formats), fp8_scaling)


def _flat(tree) -> dict[str, Array]:
  """{"blocks.0.attn.q_proj.kernel": array, ...} from an nnx State (or its gradient)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
    out[".".join(str(k) for k in keys if k != "value")] = leaf
  return out


def _scale(name, role, direction, x, stat) -> TensorScale:
  return TensorScale(name=name, role=role, direction=direction, dtype=str(x.dtype),
                     size=int(x.size), **stat)
