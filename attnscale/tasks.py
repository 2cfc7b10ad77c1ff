"""Tasks: what a config trains on. A task owns its data, batches and loss.

`train.py` and `eval.py` are task-agnostic; `get_task(config)` picks one by
`config.task`. The char LM is nanoGPT's shakespeare_char; the masked LM is a
small BERT on WikiText. A task provides `train_batch(step)`, `val_batch(i)`,
`eval_batches()` (the whole validation split, padding weighing 0),
`loss(model, batch, dropout_key)` -> (mean, sums to add over batches),
`eval_metrics(sums)` (what eval.json reports) and `attention_masks(batch)`
(what the attention diagnostics run with).

Dimension legend: B batch, T sequence, P prediction slots, V vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attnscale.data import char_lm, mlm, tokenizer


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

  def eval_metrics(self, sums: dict[str, float]) -> dict:
    loss = sums["loss_sum"] / max(sums["count"], 1.0)
    return {"val_loss": loss, "bits_per_char": loss / math.log(2),
            "val_tokens": int(len(self.data.validation) - 1)}

  def attention_masks(self, batch) -> dict:
    return {}  # causal, no padding: the model's own mask is all there is


def padding_mask(tokens_BT):
  """[B, 1, 1, T] attention mask, True for the keys that are not [PAD]."""
  return (tokens_BT != tokenizer.PAD_ID)[:, None, None, :]


class MLMTask:
  """BERT masked-LM pretraining on WikiText (`attnscale.data.mlm`): padded rows,
  dynamic 80/10/10 masking, loss and accuracy on the masked tokens only."""

  def __init__(self, config):
    self.config = config
    self.corpus = mlm.load_wikitext(config.data_dir, config.dataset)
    self.vocab_size = self.corpus.tokenizer.vocab_size
    if config.model.vocab_size != self.vocab_size:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must equal the "
                       f"tokenizer's vocabulary size ({self.vocab_size})")
    self.train_rows, self.val_rows = (
        mlm.make_rows(self.corpus.ids[s], self.corpus.offsets[s], config.seq_len)
        for s in ("train", "validation"))
    self.mask_args = {"mask_rate": config.mask_rate,
                      "mask_token_rate": config.mask_token_rate,
                      "random_token_rate": config.random_token_rate}

  @property
  def tokens_per_batch(self) -> int:
    return self.config.batch_size * self.config.seq_len  # padding included

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """This process's rows of the masked training batch for `step`."""
    return self._batch(self.train_rows, self.config.seed, step)

  def val_batch(self, index: int) -> dict[str, np.ndarray]:
    """Random masked validation rows for periodic estimates: a fixed seed, so the
    same batches at every estimate and in every run."""
    return self._batch(self.val_rows, mlm.EVAL_MASK_SEED, index)

  def _batch(self, rows, seed, step):
    return mlm.get_batch(rows, batch_size=self.config.batch_size, seed=seed, step=step,
                         vocab_size=self.vocab_size, process_index=jax.process_index(),
                         process_count=jax.process_count(), **self.mask_args)

  def eval_batches(self, batch_size: int | None = None):
    """The whole validation split, every row once, fixed masks (this process's rows)."""
    B = batch_size or self.config.batch_size
    rows = B // jax.process_count()
    lo = jax.process_index() * rows
    for batch in mlm.eval_batches(self.val_rows, batch_size=B, vocab_size=self.vocab_size,
                                  **self.mask_args):
      yield {k: v[lo:lo + rows] for k, v in batch.items()}

  def loss(self, model, batch, dropout_key=None):
    """Mean cross-entropy per masked token, and sums (loss, count, correct)."""
    inputs_BT = batch["inputs"]
    logits_BPV = model(inputs_BT, mask=padding_mask(inputs_BT), dropout_key=dropout_key,
                       positions=batch["positions"])
    total, count = cross_entropy(logits_BPV, batch["targets"], batch["weights"])
    hit_BP = jnp.argmax(logits_BPV, axis=-1) == batch["targets"]
    correct = jnp.sum(hit_BP * batch["weights"])
    return total / jnp.maximum(count, 1.0), {"loss_sum": total, "count": count,
                                             "correct": correct}

  def eval_metrics(self, sums: dict[str, float]) -> dict:
    count = max(sums["count"], 1.0)
    loss = sums["loss_sum"] / count
    return {"val_loss": loss, "perplexity": math.exp(loss),
            "accuracy": sums["correct"] / count, "val_masked_tokens": int(sums["count"])}

  def attention_masks(self, batch) -> dict:
    inputs_BT = jnp.asarray(batch["inputs"])
    return {"mask": padding_mask(inputs_BT), "query_mask_BT": inputs_BT != tokenizer.PAD_ID}


TASKS = {"char_lm": CharLMTask, "mlm": MLMTask}


def get_task(config):
  if config.task not in TASKS:
    raise ValueError(f"config.task must be one of {list(TASKS)}, got {config.task!r}")
  return TASKS[config.task](config)
