"""Evaluation at many context lengths: where a model stops coping with longer inputs.

For each length L the validation split is cut into non-overlapping windows of L
inputs and L targets (`data.char_lm.eval_batches`), so every target is scored
exactly once, with the context available inside its window (positions 0 .. L-1).
Per length: the mean loss (and bits per character), and the loss by position in
the window, the curve that shows where a model trained at length L_train stops
coping (a learned-position model cannot run past its table; a rotary or NoPE
model can, and its scaling decides what happens at n > L_train); and each layer's
attention entropy against the keys a query sees, n = position + 1, in
powers-of-two bins of n (`position_bins`): log n while attention averages all it
sees (subcritical), flat or falling once it picks a few keys (supercritical;
docs/experiments/critical_length.md reads it). Losses by position are rounded to
5 decimals (1e-5 nats, far below the spread of a position's mean over the
windows), so a 4096-long curve stays light in a results store.

A task that sets `OWN_LENGTH_EVAL` (the synthetic probes, `attnscale.tasks.synthetic`)
gives fresh examples of each length instead (`task.check_lengths`,
`task.length_examples`: one set per variant, MQAR's pairs grown and fixed), scored
with its own loss and metrics (`evaluate_examples`: exact-match accuracy beside the
loss); `format_table` prints either.

Cost: each window runs the fused kernel, which never materialises more than one
causal block's logits ([B, N, rows, L], `attnscale.core.xla_attention`); the batch
is sized to about `tokens_per_batch` tokens, so memory stays flat as L grows.

Dimension legend: B batch, L window length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnscale.data import char_lm
from attnscale.models.base import attention_stats, check_length
from attnscale.runtime import steps
from attnscale.runtime import train_state as ts
from attnscale.tasks.base import this_process_rows

TOKENS_PER_BATCH = 16384
DECIMALS = 5  # of the losses by position


def position_bins(length: int) -> list[tuple[int, int]]:
  """Positions [0, L) in powers-of-two bins [2^k - 1, 2^(k+1) - 1): 1, 2-3, 4-7, ... keys seen."""
  edges = [0] + [2**k - 1 for k in range(1, int(math.log2(length)) + 1)] + [length]
  return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


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
  if getattr(task, "OWN_LENGTH_EVAL", False):  # a Task says; a stand-in may not
    task.check_lengths(model_cfg, lengths)
    return
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
    list of L mean losses, position 0 first), "keys_bins" ([[n_lo, n_hi], ...]:
    the keys seen, inclusive, of each powers-of-two bin) and "entropy_by_keys"
    (per layer, the attention entropy in nats averaged over the bin's queries
    and the heads)}}, the loss in nats per target.
  """
  check_lengths(model.cfg, task, lengths)
  if getattr(task, "OWN_LENGTH_EVAL", False):  # a Task says; a stand-in may not
    return evaluate_examples(model, task, lengths, mesh=mesh, tokens_per_batch=tokens_per_batch)
  sharding = ts.batch_sharding(mesh)  # rows over data x fsdp, as training's
  graphdef, params = nnx.split(model, nnx.Param)

  @jax.jit
  def sums(params, batch):
    logits_BLV, stats = attention_stats(nnx.merge(graphdef, params),
                                        lambda m: m(batch["inputs"]))
    loss_BL = optax.softmax_cross_entropy_with_integer_labels(
        logits_BLV.astype(jnp.float32), batch["targets"])
    w_BL = batch["weights"]
    entropy_YL = jnp.stack([jnp.sum(s.entropy_BTN.mean(-1) * w_BL, axis=0) for s in stats])
    return jnp.sum(loss_BL * w_BL, axis=0), jnp.sum(w_BL, axis=0), entropy_YL

  devices = jax.device_count()
  results = {}
  for length in lengths:
    B = max(1, tokens_per_batch // length)
    B = -(-B // devices) * devices  # whole rows for every device
    loss_L = np.zeros(length)
    count_L = np.zeros(length)
    entropy_YL = np.zeros((len(model.blocks), length))
    batches = char_lm.eval_batches(task.data.validation, batch_size=B, seq_len=length)
    for batch in this_process_rows(batches, B):
      loss, count, entropy = jax.device_get(sums(params, steps.global_batch(batch, sharding)))
      loss_L += loss
      count_L += count
      entropy_YL += entropy
    mean = float(loss_L.sum() / count_L.sum())
    bins = position_bins(length)
    results[str(length)] = {
        "val_loss": mean, "bits_per_char": mean / math.log(2),
        "targets": int(count_L.sum()),
        "loss_by_position": [round(float(x), DECIMALS)
                             for x in loss_L / np.maximum(count_L, 1)],
        "keys_bins": [[a + 1, b] for a, b in bins],
        "entropy_by_keys": [[float(e_L[a:b].sum() / max(count_L[a:b].sum(), 1)) for a, b in bins]
                            for e_L in entropy_YL]}
  return results


def evaluate_examples(model, task, lengths: Sequence[int], *, mesh,
                      tokens_per_batch: int = TOKENS_PER_BATCH) -> dict[str, dict]:
  """A task's own examples at each length (`task.length_examples`), scored by its loss
  and `eval_metrics`: {str(L): {metrics, "args": the variant's task arguments,
  variant: {the same}}} (the main variant's at the top level)."""
  sharding = ts.batch_sharding(mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  eval_step = steps.make_eval_step(graphdef, task, None, sharding)
  devices = jax.device_count()
  results = {}
  for length in lengths:
    B = -(-max(1, tokens_per_batch // length) // devices) * devices
    out = {}
    for name, (args, batches) in task.length_examples(length, B).items():
      sums = steps.evaluate_sums(eval_step, params, batches, sharding)
      entry = task.eval_metrics(sums) | {"args": dataclasses.asdict(args)}
      if name:
        out[name] = entry
      else:
        out |= entry
    results[str(length)] = out
  return results


def format_table(by_length: dict[str, dict]) -> list[str]:
  """eval.py's lines: loss and bits/char per length, and the loss at a few positions
  (or, for a task's own evaluation, loss and exact-match accuracy per length)."""
  if any("accuracy" in r for r in by_length.values()):
    lines = ["  length | val loss | accuracy | rows all right | last target | targets"]
    for length, r in by_length.items():
      for name, e in [("", r)] + [(k, v) for k, v in r.items()
                                  if isinstance(v, dict) and "accuracy" in v]:
        lines.append(f"  {length + (' ' + name if name else ''):>6} | {e['val_loss']:8.4f} | "
                     f"{e['accuracy']:8.4f} | {e['sequence_accuracy']:14.4f} | "
                     f"{e['last_accuracy']:11.4f} | {e['val_targets']:,d}")
    return lines
  lines = ["  length | val loss | bits/char | targets | loss at positions 1, L/4, L/2, L"]
  for length, r in by_length.items():
    curve = r["loss_by_position"]
    L = len(curve)
    at = " ".join(f"{curve[i]:.3f}" for i in sorted({0, L // 4, L // 2, L - 1}))
    lines.append(f"  {int(length):6d} | {r['val_loss']:8.4f} | {r['bits_per_char']:9.4f} | "
                 f"{r['targets']:7,d} | {at}")
  return lines
