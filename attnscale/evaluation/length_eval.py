"""Evaluation at many context lengths: where a model stops coping with longer inputs.

For each length L the validation split is cut into non-overlapping windows of L
inputs and L targets (`data.char_lm.eval_batches`), so every target is scored
exactly once, with the context available inside its window (positions 0 .. L-1).
Per length: the mean loss (and bits per character), and the loss by position in
the window, the curve that shows where a model trained at length L_train stops
coping (a learned-position model cannot run past its table; a rotary or NoPE
model can, and its scaling decides what happens at n > L_train).

Cost: each window runs the fused kernel, which never materialises more than one
causal block's logits ([B, N, rows, L], `attnscale.core.xla_attention`); the batch
is sized to about `tokens_per_batch` tokens, so memory stays flat as L grows.

Dimension legend: B batch, L window length, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnscale.data import char_lm
from attnscale.models.base import check_length
from attnscale.runtime import steps
from attnscale.runtime import train_state as ts
from attnscale.tasks.base import this_process_rows

TOKENS_PER_BATCH = 16384


def parse_lengths(text: str) -> list[int]:
  """"128,256,512" -> [128, 256, 512]; a one-line ValueError naming --lengths otherwise."""
  try:
    lengths = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"--lengths must be comma-separated positive integers, got {text!r}") from None
  if not lengths or min(lengths) < 1:
    raise ValueError(f"--lengths must be comma-separated positive integers, got {text!r}")
  return sorted(set(lengths))


def check_lengths(model_cfg, task, lengths: Sequence[int]) -> None:
  """Every problem with `lengths`, before any work: one-line ValueErrors.

  Args:
    model_cfg: the model's `ModelConfig` (its positions and block_size).
    task: the run's task.
    lengths: window lengths.
  """
  if not hasattr(task, "data") or not hasattr(task.data, "validation"):
    raise ValueError(f"--lengths evaluates a language model over a token stream: task "
                     f"{task.config.task!r} has none (use the char_lm task)")
  num_targets = len(task.data.validation) - 1
  for length in lengths:
    if length > num_targets:
      raise ValueError(f"--lengths: {length} is longer than the validation split "
                       f"({num_targets} targets)")
    try:
      check_length(model_cfg, length)
    except ValueError as e:
      raise ValueError(f"--lengths: {e}") from None


def evaluate_lengths(model, task, lengths: Sequence[int], *, mesh,
                     tokens_per_batch: int = TOKENS_PER_BATCH) -> dict[str, dict]:
  """Loss at each context length, and by position in the window.

  Args:
    model: a causal LM (`attnscale.models.Model`).
    task: its task (`tasks.char_lm.CharLMTask`: `task.data.validation` is the
      token stream).
    lengths: window lengths L.
    mesh: the device mesh; batches are sharded on its `data` axis.
    tokens_per_batch: about B * L tokens per batch (B a multiple of the device count).

  Returns:
    {str(L): {"val_loss", "bits_per_char", "targets", "loss_by_position" (a
    list of L mean losses, position 0 first)}}, the loss in nats per target.
  """
  check_lengths(model.cfg, task, lengths)
  sharding = ts.batch_sharding(mesh)  # rows over data x fsdp, as training's
  graphdef, params = nnx.split(model, nnx.Param)

  @jax.jit
  def sums(params, batch):
    logits_BLV = nnx.merge(graphdef, params)(batch["inputs"])
    loss_BL = optax.softmax_cross_entropy_with_integer_labels(
        logits_BLV.astype(jnp.float32), batch["targets"])
    w_BL = batch["weights"]
    return jnp.sum(loss_BL * w_BL, axis=0), jnp.sum(w_BL, axis=0)

  devices = jax.device_count()
  results = {}
  for length in lengths:
    B = max(1, tokens_per_batch // length)
    B = -(-B // devices) * devices  # whole rows for every device
    loss_L = np.zeros(length)
    count_L = np.zeros(length)
    batches = char_lm.eval_batches(task.data.validation, batch_size=B, seq_len=length)
    for batch in this_process_rows(batches, B):
      loss, count = jax.device_get(sums(params, steps.global_batch(batch, sharding)))
      loss_L += loss
      count_L += count
    mean = float(loss_L.sum() / count_L.sum())
    results[str(length)] = {
        "val_loss": mean, "bits_per_char": mean / math.log(2),
        "targets": int(count_L.sum()),
        "loss_by_position": [float(x) for x in loss_L / np.maximum(count_L, 1)]}
  return results


def format_table(by_length: dict[str, dict]) -> list[str]:
  """eval.py's lines: loss and bits/char per length, and the loss at a few positions."""
  lines = ["  length | val loss | bits/char | targets | loss at positions 1, L/4, L/2, L"]
  for length, r in by_length.items():
    curve = r["loss_by_position"]
    L = len(curve)
    at = " ".join(f"{curve[i]:.3f}" for i in sorted({0, L // 4, L // 2, L - 1}))
    lines.append(f"  {int(length):6d} | {r['val_loss']:8.4f} | {r['bits_per_char']:9.4f} | "
                 f"{r['targets']:7,d} | {at}")
  return lines
