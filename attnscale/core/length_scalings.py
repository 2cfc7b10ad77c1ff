"""Scalings whose temperature grows with the sequence: s_i rises with the key count
n_i or the query's position, so that attention stays sharp past what training saw.

    log_n               Scalable-Softmax (Nakanishi 2025): s log(n_i) / sqrt(d), s learned
    log_n_ratio         Qwen's logn attention: max(1, log_L(n_i)) / sqrt(d)
    temperature_tuning  Llama 4's attention temperature, by query position
    yarn                YaRN's temperature (Peng et al. 2023), by n_i / L

All but log_n are exactly standard attention up to the training length L (a
model fills L from `model.block_size`, `from_dims`), so they only matter when a
model runs longer than it was trained: docs/experiments/length.md measures that.
Each counts only the keys its query sees (`VisibleKeys.count`, causal prefix and
no padding), never the total length, so a prefix's outputs are the full
sequence's there; each folds into q, so the fused kernel serves it.

They register in scalings.py's registry on import (attnscale/core/__init__.py
imports this module), so configs name them as any other: `scalings.get("yarn")`.

Dimension legend: B batch, T queries, N query heads, H head dim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from attnscale.core.scalings import Dims, Learned, Scaled, register
from attnscale.core.visibility import upcast


@dataclasses.dataclass(frozen=True)
class LogN:
  """s_i = s * log(n_i) / sqrt(d): Scalable-Softmax, logits grow with the log of the key count.

  Nakanishi 2025, "Scalable-Softmax Is Superior for Attention" (arXiv
  2501.19399): softmax(s log(n) z) with z the standard logits and s a learned
  scalar per head (and layer), so the largest weight does not fade as n grows
  (plain softmax's does, as 1/n for fixed logits). Chiang & Cholak 2022,
  "Overcoming a Theoretical Limitation of Self-Attention" (arXiv 2202.12172)
  multiply by log n with no learned factor: s = 1, the default here
  (`scalings.get("log_n")`).

  In a model s is learned per head and initialised to s0 = 1 / log(L), L the
  training length (`model.block_size`): at n_i = L the model starts as standard
  attention, shorter prefixes start flatter, longer ones sharper.
  `model.scaling_params={"s": v}` fixes s instead.

  Causal rule: n_i is the number of keys query i sees (its causal prefix, the
  non-padded keys), never the total length, so a prefix's outputs equal the
  full sequence's there. At n_i = 1 the factor is 0: one visible key gets
  weight 1 whatever its logit. It folds into q: the fused kernel serves it.
  """

  s: Any = 1.0  # scalar or [N] (one per head)

  def __call__(self, q, k, keys):
    s = upcast(self.s)
    if s.ndim:  # one per head: [N] -> [1, 1, N] against n_i's [B|1, T, N]
      s = s.reshape((1,) * (3 - s.ndim) + s.shape)
    log_n_BTN = jnp.log(jnp.maximum(keys.count(), 1.0))
    return Scaled(q, k, logit_scale=s * log_n_BTN * q.shape[-1] ** -0.5)


def log_n_init(dims: Dims) -> float:
  """LogN's s0 = 1 / log(L): standard attention at the training length L."""
  if dims.train_len < 2:
    raise ValueError(f"log_n needs a training length >= 2, got {dims.train_len}")
  return 1.0 / math.log(dims.train_len)


@dataclasses.dataclass(frozen=True)
class LogNRatio:
  """s_i = max(1, log(n_i) / log(L)) / sqrt(d): standard up to the training length, sharper past it.

  Qwen's "logn attention" (Qwen Technical Report, Bai et al. 2023, arXiv
  2309.16609, section 2.2 (long-context extension), following Su 2021's
  entropy-invariant scaling): past the training length L the logits are scaled
  by log_L(n_i) so the attention entropy stays near what training saw. Identical
  to standard attention for every n_i <= L, so it only matters when a model
  runs longer than it was trained.

  Causal rule: n_i is query i's own key count (Qwen's code indexes its table by
  the query position, which is n_i under causality), not the total length.
  `train_len` defaults to 2048 (Qwen-7B's pre-training length) for analysis; a
  model passes its `model.block_size` (`from_dims`).
  """

  train_len: int = 2048

  def __post_init__(self):
    if not self.train_len >= 2:
      raise ValueError(f"log_n_ratio's train_len must be >= 2, got {self.train_len}")

  def __call__(self, q, k, keys):
    ratio_BTN = jnp.log(jnp.maximum(keys.count(), 1.0)) / math.log(self.train_len)
    return Scaled(q, k, logit_scale=jnp.maximum(ratio_BTN, 1.0) * q.shape[-1] ** -0.5)


@dataclasses.dataclass(frozen=True)
class TemperatureTuning:
  """s_i = (1 + beta log(floor((i + 1) / floor_scale) + 1)) / sqrt(d), i the query's position.

  Llama 4's attention temperature tuning (Meta 2025, "The Llama 4 herd"; Hugging
  Face transformers' Llama4TextAttention, `attn_temperature_tuning`: the
  queries of its no-position layers multiplied by this factor, beta =
  `attn_scale` = 0.1, floor_scale = 8192). Exactly standard for the first
  floor_scale - 1 positions, then log-growing sharper logits in steps of
  floor_scale: log-n-like, by the query's position rather than its key count.

  Causal rule: the factor depends on the query's own position only (0 ... T-1,
  top-left aligned as the causal mask), never on later keys, so a prefix gets
  the full sequence's factors. `floor_scale` defaults to Llama 4's 8192 for
  analysis; a model passes its training length `model.block_size` (`from_dims`),
  so training is standard and the factor acts past it.
  """

  beta: float = 0.1
  floor_scale: int = 8192

  def __post_init__(self):
    if not self.floor_scale >= 1:
      raise ValueError(f"temperature_tuning's floor_scale must be >= 1, got {self.floor_scale}")

  def __call__(self, q, k, keys):
    i_1T1 = jnp.arange(keys.q_len, dtype=jnp.float32)[None, :, None]
    factor_1T1 = 1.0 + self.beta * jnp.log(jnp.floor((i_1T1 + 1.0) / self.floor_scale) + 1.0)
    return Scaled(q, k, logit_scale=factor_1T1 * q.shape[-1] ** -0.5)


@dataclasses.dataclass(frozen=True)
class Yarn:
  """s_i = (0.1 ln(r_i) + 1)^2 / sqrt(d), r_i = max(1, n_i / train_len).

  YaRN's attention temperature (Peng et al. 2023, "YaRN: Efficient Context Window
  Extension of Large Language Models", arXiv 2309.00071, section 3.4, "dynamic
  scaling" and eq. 22): sqrt(1/t) = 0.1 ln(r) + 1 multiplies both q and k, so
  the logits by its square, r being the context extension factor. Here r is per
  query, the keys it sees over the training length, floored at 1: exactly
  standard within the training length, sharper past it.

  Causal rule: r_i counts query i's visible keys (causal prefix, not padding),
  as log_n_ratio's n_i; YaRN's own r is one number for the whole context, which
  a causal model must not take from keys a query cannot see. `train_len`
  defaults to 2048 for analysis; a model passes its `model.block_size`
  (`from_dims`).
  """

  train_len: int = 2048

  def __post_init__(self):
    if not self.train_len >= 1:
      raise ValueError(f"yarn's train_len must be >= 1, got {self.train_len}")

  def __call__(self, q, k, keys):
    r_BTN = jnp.maximum(keys.count() / self.train_len, 1.0)
    mscale_BTN = 0.1 * jnp.log(r_BTN) + 1.0
    return Scaled(q, k, logit_scale=jnp.square(mscale_BTN) * q.shape[-1] ** -0.5)


# muP: a logit factor that depends on the sequence, which no published muP rule covers.
NO_MUP = "its logit factor grows with the sequence, and no muP rule is defined for that"
# Scalable-Softmax: s learned per head, s0 = 1/log(L) (standard at the training length).
register("log_n", bilinear=True, learned={"s": Learned(("heads",), init=log_n_init)},
         config_args=("s",), mup=NO_MUP)(LogN)
register("log_n_ratio", bilinear=True, mup=NO_MUP,
         from_dims={"train_len": lambda dims: dims.train_len})(LogNRatio)
# The 2025 temperature scalings: standard within the training length (from_dims).
register("temperature_tuning", bilinear=True, mup=NO_MUP,
         from_dims={"floor_scale": lambda dims: dims.train_len})(TemperatureTuning)
register("yarn", bilinear=True, mup=NO_MUP,
         from_dims={"train_len": lambda dims: dims.train_len})(Yarn)
