"""Character-level language modelling: nanoGPT's shakespeare_char, on any char corpus.

The corpus is `config.dataset`, a key of `attnscale.data.char_lm.DATASETS`
(tiny Shakespeare, WikiText-2 as characters); its vocabulary comes from the data,
so `model.vocab_size` must equal it. Training batches are random windows,
evaluation covers every validation target once, and the loss is the mean
next-character cross-entropy, reported also in bits per character
(loss / ln 2). The model is a causal decoder, so it samples text (nanoGPT's
sample.py: temperature and top-k).

Dimension legend: T sequence, V vocabulary.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.data import char_lm
from attnscale.tasks.base import NextTokenTask, Sampler, this_process_rows


def sample(model, encode, decode, *, prompt: str, length: int, temperature: float,
           top_k: int | None, seed: int) -> str:
  """nanoGPT-style sampling: crop to the last block_size tokens, temperature, top-k.

  Next token ~ softmax(logits / temperature) restricted to the top_k logits
  (nanoGPT's sample.py). The window is right-padded to block_size so one
  compiled forward serves every step; causal attention keeps the padding
  invisible to the real tokens.
  """
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  if not prompt:
    # The first prediction reads the prompt's last position: there must be one.
    raise ValueError("prompt must not be empty (nanoGPT's default is '\\n')")
  T = model.cfg.block_size

  @jax.jit
  def next_token(window_1T, last, key):
    logits_V = model(window_1T)[0, last] / temperature
    if top_k:
      kth = jax.lax.top_k(logits_V, min(top_k, logits_V.shape[-1]))[0][-1]
      logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V)

  tokens = list(encode(prompt))
  num_prompt = len(tokens)  # a subword prompt's tokens are fewer than its characters
  key = jax.random.key(seed)
  for i in range(length):
    context = tokens[-T:]
    window_1T = np.zeros((1, T), np.int32)
    window_1T[0, :len(context)] = context
    tokens.append(int(next_token(window_1T, len(context) - 1, jax.random.fold_in(key, i))))
  return decode(tokens[num_prompt:])


class CharLMTask(NextTokenTask):
  """Next-character prediction on `config.dataset` (random training windows)."""

  UNIT = "character"
  get_batch = staticmethod(char_lm.get_batch)
  DATASETS = tuple(char_lm.DATASETS)

  def __init__(self, config):
    super().__init__(config)
    self.data = char_lm.load(config.dataset, config.data_dir)
    if config.model.vocab_size != self.data.vocab_size:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must equal the "
                       f"vocabulary size of config.dataset={config.dataset!r} "
                       f"({self.data.vocab_size}): set "
                       f"--config.model.vocab_size={self.data.vocab_size}")

  def eval_batches(self, batch_size: int | None = None):
    """Non-overlapping windows over the whole validation split, every target once."""
    B = batch_size or self.config.batch_size
    return this_process_rows(
        char_lm.eval_batches(self.data.validation, batch_size=B, seq_len=self.config.seq_len),
        B)

  def eval_metrics(self, sums):
    loss = sums["loss_sum"] / max(sums["count"], 1.0)
    return {"val_loss": loss, "bits_per_char": loss / math.log(2),
            "val_tokens": int(len(self.data.validation) - 1)}

  @classmethod
  def format_summary(cls, result):
    s = result["sample"]
    return [f"  validation loss {result['val_loss']:.4f} | {result['bits_per_char']:.4f} "
            f"bits/char over all {result['val_tokens']:,} validation targets",
            f"  sample (temperature {s['temperature']}, top-k {s['top_k']}, seed {s['seed']}):",
            "  " + "-" * 60, s["prompt"] + s["text"], "  " + "-" * 60]

  @property
  def sampler(self) -> Sampler:
    return functools.partial(sample, encode=self.data.encode, decode=self.data.decode)
