"""Masked-LM pretraining: a small BERT on WikiText (Devlin et al. 2019).

Rows are [CLS] ids [SEP] [PAD]... cut from WikiText paragraphs, 15% of the real
tokens selected per row and 80/10/10 [MASK]/random/kept, redrawn every step
(`attnscale.data.mlm`). The loss and accuracy are over the selected tokens only;
padded keys are masked out of every attention call, and out of the attention
diagnostics' queries too.

Dimension legend: B batch, T sequence, P prediction slots, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attnscale.data import mlm, tokenizer, wikitext
from attnscale.fields import field
from attnscale.tasks import losses
from attnscale.tasks.base import Task, cross_entropy, this_process_rows


def padding_mask(tokens_BT):
  """[B, 1, 1, T] attention mask, True for the keys that are not [PAD]."""
  return (tokens_BT != tokenizer.PAD_ID)[:, None, None, :]


def full_head_loss(model, batch, dropout_key=None):
  """The reference for `MLMTask.loss`: the head on all T positions, then the P picked.

  (sum of token losses, count), as `cross_entropy`. Costs T / P times the
  gathered head's dense + GELU + LN + [D, V] projection and holds [B, T, V]
  logits; for tests/test_mlm.py and benchmarks/mlm_head.py only.
  """
  inputs_BT = batch["inputs"]
  logits_BTV = model(inputs_BT, mask=padding_mask(inputs_BT), dropout_key=dropout_key)
  logits_BPV = jnp.take_along_axis(logits_BTV, batch["positions"][..., None], axis=1)
  return cross_entropy(logits_BPV, batch["targets"], batch["weights"])


@dataclasses.dataclass(frozen=True)
class MLMFields:
  """The masked LM's own config fields (Devlin et al. 2019), redrawn each step from
  (seed, step)."""

  mask_rate: float = field(0.15, "fraction of each row's real tokens selected for prediction")
  mask_token_rate: float = field(0.8, "of those: replaced by [MASK]")
  random_token_rate: float = field(
      0.1, "replaced by a random real token (the rest stay as they are)")
  max_predictions_per_seq: int | None = field(
      None, "BERT's max_predictions_per_seq: prediction slots P per row (at most P tokens "
      "of a row are selected); the MLM head runs on these P gathered positions only. None "
      "= ceil(mask_rate * (seq_len - 2)): 19 at 128, 77 at 512")


class MLMTask(Task):
  """BERT masked-LM pretraining on WikiText (`attnscale.data.mlm`): padded rows,
  dynamic 80/10/10 masking, loss and accuracy on the masked tokens only."""

  DATASETS = tuple(wikitext.WikitextParagraphs.builder_configs)  # wikitext2, wikitext2_2k, wikitext103
  CONFIG_FIELDS = MLMFields

  @classmethod
  def validate_config(cls, config) -> None:
    super().validate_config(config)
    if config.model.causal:
      raise ValueError("model.causal must be False for task 'mlm' (a bidirectional encoder)")
    if config.seq_len < 3:
      raise ValueError(f"config.seq_len must be >= 3 for task 'mlm' ([CLS], a token, [SEP]), "
                       f"got {config.seq_len}")
    for name in ("mask_rate", "mask_token_rate", "random_token_rate"):
      value = getattr(config, name)
      if not 0 <= value <= 1:
        raise ValueError(f"config.{name} must be in [0, 1], got {value}")
    if config.mask_rate == 0:
      raise ValueError("config.mask_rate must be > 0, got 0")
    mlm.num_predictions(config.seq_len, config.mask_rate,
                        config.max_predictions_per_seq)  # checks it
    if config.mask_token_rate + config.random_token_rate > 1:
      raise ValueError(f"config.mask_token_rate + config.random_token_rate must be <= 1, got "
                       f"{config.mask_token_rate} + {config.random_token_rate}")

  def __init__(self, config):
    super().__init__(config)
    self.corpus = mlm.load_wikitext(config.data_dir, config.dataset)
    self.vocab_size = self.corpus.tokenizer.vocab_size
    if config.model.vocab_size != self.vocab_size:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must equal the "
                       f"tokenizer's vocabulary size ({self.vocab_size}): set "
                       f"--config.model.vocab_size={self.vocab_size}")
    self.train_rows, self.val_rows = (
        mlm.make_rows(self.corpus.ids[s], self.corpus.offsets[s], config.seq_len)
        for s in ("train", "validation"))
    self.mask_args = {"mask_rate": config.mask_rate,
                      "mask_token_rate": config.mask_token_rate,
                      "random_token_rate": config.random_token_rate,
                      "max_predictions": config.max_predictions_per_seq}

  @classmethod
  def batch_spec(cls, config, *, train=True):
    del train  # training and evaluation batches have one layout
    B, T = config.batch_size, config.seq_len
    # Configs saved before the field existed lack it: None, the same default.
    P = mlm.num_predictions(T, config.mask_rate, config.max_predictions_per_seq)
    return {"inputs": jax.ShapeDtypeStruct((B, T), jnp.int32),
            "positions": jax.ShapeDtypeStruct((B, P), jnp.int32),
            "targets": jax.ShapeDtypeStruct((B, P), jnp.int32),
            "weights": jax.ShapeDtypeStruct((B, P), jnp.float32)}

  def train_batch(self, step: int):
    return self._batch(self.train_rows, self.config.seed, step)

  def val_batch(self, index: int):
    # A fixed seed: the same batches at every estimate and in every run.
    return self._batch(self.val_rows, mlm.EVAL_MASK_SEED, index)

  def _batch(self, rows, seed, step):
    return mlm.get_batch(rows, batch_size=self.config.batch_size, seed=seed, step=step,
                         vocab_size=self.vocab_size, process_index=jax.process_index(),
                         process_count=jax.process_count(), **self.mask_args)

  def eval_batches(self, batch_size: int | None = None):
    """Every validation row once, with fixed masks."""
    B = batch_size or self.config.batch_size
    return this_process_rows(
        mlm.eval_batches(self.val_rows, batch_size=B, vocab_size=self.vocab_size,
                         **self.mask_args), B)

  def loss(self, model, batch, dropout_key=None):
    """Mean cross-entropy per masked token, and sums (loss, count, correct, and the
    output logits' z-loss sum and health at the masked tokens: `losses.output_sums`).

    The model's head runs on the P selected positions only (`positions=`: a
    gather of the final residual stream before the MLM head), as BERT's
    `gather_indexes`: the same loss and gradients as projecting all T positions
    and picking the P after (tests/test_mlm.py), at ~0.15 of the head's cost.
    """
    inputs_BT = batch["inputs"]
    logits_BPV = model(inputs_BT, mask=padding_mask(inputs_BT), dropout_key=dropout_key,
                       positions=batch["positions"])
    total, count = cross_entropy(logits_BPV, batch["targets"], batch["weights"])
    hit_BP = jnp.argmax(logits_BPV, axis=-1) == batch["targets"]
    correct = jnp.sum(hit_BP * batch["weights"])
    return total / jnp.maximum(count, 1.0), {
        "loss_sum": total, "count": count, "correct": correct,
        **losses.output_sums(logits_BPV, batch["weights"])}

  def eval_metrics(self, sums):
    count = max(sums["count"], 1.0)
    loss = sums["loss_sum"] / count
    return {"val_loss": loss, "perplexity": math.exp(loss),
            "accuracy": sums["correct"] / count, "val_masked_tokens": int(sums["count"])}

  @classmethod
  def format_summary(cls, result):
    return [f"  validation MLM loss {result['val_loss']:.4f} | perplexity "
            f"{result['perplexity']:.2f} | masked-token accuracy {result['accuracy']:.4f} "
            f"over all {result['val_masked_tokens']:,} masked validation tokens"]

  def attention_masks(self, batch):
    """The padding mask the model trains with; only real tokens count as queries."""
    inputs_BT = jnp.asarray(batch["inputs"])
    return padding_mask(inputs_BT), inputs_BT != tokenizer.PAD_ID
