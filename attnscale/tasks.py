"""Tasks: what a config trains on. A task owns its data, batches and loss.

`train.py` and `eval.py` are task-agnostic; `get_task(config)` picks one by
`config.task`. The char LM is nanoGPT's shakespeare_char.

Dimension legend: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attnscale.data import char_lm


def cross_entropy(logits_BTV, targets_BT, weights_BT=None):
  """(sum of weighted token losses, sum of weights), in float32."""
  loss_BT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV.astype(jnp.float32), targets_BT)
  if weights_BT is None:
    weights_BT = jnp.ones_like(loss_BT)
  return jnp.sum(loss_BT * weights_BT), jnp.sum(weights_BT)


class CharLMTask:
  """Next-character prediction on tiny Shakespeare (random training windows)."""

  def __init__(self, config):
    self.config = config
    self.data = char_lm.load_tiny_shakespeare(config.data_dir)
    if config.model.vocab_size != self.data.vocab_size:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must equal the "
                       f"dataset's vocabulary size ({self.data.vocab_size})")

  @property
  def tokens_per_batch(self) -> int:
    return self.config.batch_size * self.config.seq_len

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """This process's rows of the training batch for `step`."""
    return self._random_batch(self.data.train, self.config.seed, step)

  def val_batch(self, index: int) -> dict[str, np.ndarray]:
    """Random validation windows (for periodic estimates); fixed per index."""
    # A seed disjoint from training's, and the same batches at every estimate.
    return self._random_batch(self.data.validation, 2**31 - 1 - self.config.seed, index)

  def _random_batch(self, tokens, seed, step):
    inputs, targets = char_lm.get_batch(
        tokens, batch_size=self.config.batch_size, seq_len=self.config.seq_len, seed=seed,
        step=step, process_index=jax.process_index(), process_count=jax.process_count())
    return {"inputs": inputs, "targets": targets}

  def eval_batches(self, batch_size: int | None = None):
    """The whole validation split, every target once (this process's rows)."""
    B = batch_size or self.config.batch_size
    rows = B // jax.process_count()
    lo = jax.process_index() * rows
    for batch in char_lm.eval_batches(self.data.validation, batch_size=B,
                                      seq_len=self.config.seq_len):
      yield {k: v[lo:lo + rows] for k, v in batch.items()}

  def loss(self, model, batch, dropout_key=None):
    """Mean cross-entropy per (weighted) target token, and metrics to sum."""
    logits_BTV = model(batch["inputs"], dropout_key=dropout_key)
    total, count = cross_entropy(logits_BTV, batch["targets"], batch.get("weights"))
    return total / jnp.maximum(count, 1.0), {"loss_sum": total, "count": count}


TASKS = {"char_lm": CharLMTask}


def get_task(config):
  if config.task not in TASKS:
    raise ValueError(f"config.task must be one of {list(TASKS)}, got {config.task!r}")
  return TASKS[config.task](config)
