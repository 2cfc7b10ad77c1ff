"""Reading a compiled program's HLO text: which attention kernel it holds, its
collectives, and whether any collective moves an activation (FSDP should move only
weights and gradients). `attnscale.runtime.aot` reads every compiled step with these.
"""

from __future__ import annotations

import math
import re

import jax

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def attention_kernel(hlo: str) -> str:
  """Which fused attention the compiled program holds: splash, cudnn or xla."""
  if "splash_" in hlo and "tpu_custom_call" in hlo:
    return "splash"
  if "__cudnn$fmha" in hlo:
    return "cudnn"
  return "xla"


_COLLECTIVE_RE = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def count_collectives(hlo: str) -> dict[str, int]:
  """How many of each collective the compiled HLO holds (async pairs counted once)."""
  counts = dict.fromkeys(COLLECTIVES, 0)
  for m in _COLLECTIVE_RE.finditer(hlo):
    counts[m.group(2)] += 1
  return counts


_SHAPE_RE = re.compile(r"[a-z]+[0-9]*\[([\d,]*)\]")


def activation_collectives(hlo: str, params, batch_spec, num_devices: int,
                           model_dims=()) -> list[str]:
  """The collectives that move an activation, as their HLO result shapes.

  FSDP's collectives move parameters (all-gather) and gradients (reduce-scatter,
  all-reduce), which XLA may combine or concatenate, so sizes say little; but
  an activation has a batch dimension: a result with an axis of the global or
  per-device batch, or of its tokens (B, B T, and their shards over the
  devices), that no parameter has, and at least one device's share of the
  batch in size, is listed, as is every all-to-all.
  `model_dims` (heads, head dim) are parameter axes too: XLA gathers a
  projection reshaped to [N, H, D]. A batch axis of the same size as one of
  those is not caught (nanogpt: B = H = 64), but its B T is.

  Not listed: a weight gathered in stages. On a large slice the TPU compiler
  gathers a matrix's 64 shards as two all-gathers, the first over groups of 32
  devices: bf16[1,6,384] (one device's 6 of 384 rows) -> bf16[32,6,384], then
  reshaped to the weight. Its leading axis counts devices, not rows of the batch
  (32 = nanogpt's batch 64 over 2), so a result [g, ...] with g dividing the
  device count whose other axes merge into a parameter's (g times its second
  axis dividing a parameter's leading axes, its last axes the parameter's) is
  a weight (`_staged_weight_gather`). Nor a parameter's FSDP shard (`_parameter_shard`:
  GPT-2 small's position table's gradient reduce-scattered from f32[1024,768] to
  f32[128,768] on 8 H100s, where 128 is also the batch of 512 over 4 devices).
  """
  param_dims = {d for x in jax.tree.leaves(params) for d in x.shape} | set(model_dims)
  param_shapes = {tuple(x.shape) for x in jax.tree.leaves(params) if x.ndim >= 2}
  batch_dims = set()
  for x in jax.tree.leaves(batch_spec):
    for n in (x.shape[0], math.prod(x.shape)):
      batch_dims |= {n // d for d in range(1, num_devices + 1) if n % d == 0}
  batch_dims -= param_dims | {1}
  # An activation is at least one device's share of the batch (the token ids);
  # smaller results with a batch-sized axis are the loss's sums.
  smallest = min(x.size // num_devices for x in jax.tree.leaves(batch_spec))
  found = []
  for m in _COLLECTIVE_RE.finditer(hlo):
    shapes = [[int(d) for d in shape.split(",") if d] for shape in _SHAPE_RE.findall(m.group(1))]
    shapes = [dims for dims in shapes if not _parameter_shard(dims, param_shapes, num_devices)]
    if m.group(2) == "all-gather":
      shapes = [dims for dims in shapes
                if not _staged_weight_gather(dims, param_shapes, num_devices)]
    big = {d for dims in shapes if math.prod(dims) >= smallest for d in dims}
    if m.group(2) == "all-to-all" or big & batch_dims:
      found.append(f"{m.group(2)} {m.group(1)[:200]}")
  return found


def _staged_weight_gather(dims: list[int], param_shapes, num_devices: int) -> bool:
  """Whether an all-gather's result [g, a, *rest] is a stage of gathering a weight:
  g divides the device count, a is one device's shard of a parameter's axis (a k
  for some k >= g dividing the device count), and [g a, *rest] is a slice of
  that parameter's rows (g a divides its leading axes' product, *rest its last)."""
  if len(dims) < 3 or dims[0] < 2 or num_devices % dims[0]:
    return False
  shards = {dims[1] * k for k in range(dims[0], num_devices + 1) if num_devices % k == 0}
  rows, rest = dims[0] * dims[1], tuple(dims[2:])
  for shape in param_shapes:
    lead = shape[:len(shape) - len(rest)]
    if (lead and shape[len(lead):] == rest and math.prod(lead) % rows == 0
        and shards & set(lead)):
      return True
  return False


def _parameter_shard(dims: list[int], param_shapes, num_devices: int) -> bool:
  """Whether a collective's result of shape `dims` is one FSDP shard of a parameter
  (of its gradient): a parameter's shape with one axis divided by k > 1, k dividing
  the device count (`train_state.fsdp_spec` splits one axis so)."""
  for shape in param_shapes:
    if len(shape) != len(dims):
      continue
    differ = [i for i, (a, b) in enumerate(zip(shape, dims)) if a != b]
    if (len(differ) == 1 and dims[differ[0]] > 0 and shape[differ[0]] % dims[differ[0]] == 0
        and num_devices % (shape[differ[0]] // dims[differ[0]]) == 0):
      return True
  return False
