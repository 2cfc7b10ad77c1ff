"""Scalings whose temperature grows with the sequence: s_i rises with the key count
n_i or the query's position, so that attention stays sharp past what training saw.

    log_n               Scalable-Softmax (Nakanishi 2025): s log(n_i) / sqrt(d), s learned
    log_n_ratio         Qwen's logn attention: max(1, log_L(n_i)) / sqrt(d)
    temperature_tuning  Llama 4's attention temperature, by query position
    yarn                YaRN's temperature (Peng et al. 2023), by n_i / L
    log_n_power         gamma (log n_i / log L)^p / sqrt(d): the critical log law, p a field
    n_power             gamma (n_i / L)^a / sqrt(d): the power law n^(2/(d-1)) of the sphere
    scale_invariant     Anson et al. 2025: a_t l + m_t by the distance t = i - j (not foldable)

log_n_ratio, temperature_tuning and yarn are exactly standard attention up to
the training length L (a model fills L from `model.block_size`, `from_dims`), so
they only matter when a model runs longer than it was trained:
docs/experiments/length.md measures that. log_n_power and n_power are standard
at n_i = L with gamma = 1 (docs/experiments/critical_length.md simulates where
the critical scale sits).
Each counts only the keys its query sees (`VisibleKeys.count`, causal prefix and
no padding), never the total length, so a prefix's outputs are the full
sequence's there; each but scale_invariant folds into q, so the fused kernel
serves it (scale_invariant's per-pair transform runs in the XLA kernel).

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


# ---------------------------------------------------------------------------
# The critical-length family (docs/experiments/critical_length.md): how
# the logit scale should grow with n, as a law with an exponent, not a recipe.


@dataclasses.dataclass(frozen=True)
class LogNPower:
  """s_i = gamma * (log n_i)^p / (log L)^p / sqrt(d): the log law with an exponent.

  The critical scaling of Chen, Lin, Polyanskiy & Rigollet 2025, "Critical
  attention scaling in long-context transformers" (arXiv 2510.05554, ICLR 2026):
  logits multiplied by beta_n = gamma log n have a phase transition in gamma,
  and beta_n ~ log n is the scaling between rank collapse (all tokens to one
  direction) and attention reducing to the identity; p = 1 is that law, other p
  test it (p = 0 is standard attention at every n). Dividing by f(L) = (log L)^p,
  L the training length (`model.block_size`, `from_dims`), keeps the trained
  scale at n_i = L, so gamma = 1 is standard there (Qwen's log_L(n) is p = 1
  floored at 1; this one is not floored: shorter prefixes are flatter).
  `normalise=False` drops the 1/f(L): s_i = gamma (log n_i)^p / sqrt(d).

  Causal rule: n_i counts the keys query i sees (`VisibleKeys.count`), never
  the total length. (log 1)^p = 0 for p > 0 (one key: weight 1 anyway) and
  0^0 = 1, so p = 0 is exactly standard. Folds into q: the fused kernel serves it.
  """

  gamma: float = 1.0
  p: float = 1.0
  train_len: int = 2048
  normalise: bool = True

  def __post_init__(self):
    if not self.p >= 0:
      raise ValueError(f"log_n_power's p must be >= 0, got {self.p}")
    if self.normalise and self.p > 0 and not self.train_len >= 2:
      raise ValueError(f"log_n_power's train_len must be >= 2 (log L > 0), got {self.train_len}")

  def __call__(self, q, k, keys):
    log_n_BTN = jnp.log(jnp.maximum(keys.count(), 1.0))
    f_BTN = jnp.ones_like(log_n_BTN) if self.p == 0 else log_n_BTN ** self.p
    norm = math.log(self.train_len) ** self.p if self.normalise else 1.0
    return Scaled(q, k, logit_scale=self.gamma / norm * f_BTN * q.shape[-1] ** -0.5)


@dataclasses.dataclass(frozen=True)
class NPower:
  """s_i = gamma * (n_i / L)^a / sqrt(d): the power law in the key count.

  "Scaling limits of long-context transformers" (arXiv 2605.08505, 2026): for
  a fixed query and n i.i.d. keys uniform on the sphere S^{d-1}, selectivity
  emerges at beta_n* ~ n^{2/(d-1)}, set by the local distribution of distances
  to the query (the mass of a cap of angular radius r scales as r^{d-1}); so
  a = 2/(d-1) is that law's exponent, and a = 0 is standard attention.
  Normalised as `LogNPower`: f(n)/f(L) = (n_i/L)^a with L the training length
  (`from_dims`), gamma = 1 standard at n_i = L; `normalise=False` gives
  s_i = gamma n_i^a / sqrt(d).

  Causal rule: n_i counts the keys query i sees, never the total length.
  Folds into q: the fused kernel serves it.
  """

  gamma: float = 1.0
  a: float = 0.0
  train_len: int = 2048
  normalise: bool = True

  def __post_init__(self):
    if not math.isfinite(self.a):
      raise ValueError(f"n_power's a must be a finite number, got {self.a}")
    if not self.train_len >= 1:
      raise ValueError(f"n_power's train_len must be >= 1, got {self.train_len}")

  def __call__(self, q, k, keys):
    n_BTN = jnp.maximum(keys.count(), 1.0)
    if self.normalise:
      n_BTN = n_BTN / self.train_len
    return Scaled(q, k, logit_scale=self.gamma * n_BTN ** self.a * q.shape[-1] ** -0.5)


# Two names, one per law, each with its own exponent field (p for the log law, a for
# the power law): a config then names the law it means and cannot set the other's field.
register("log_n_power", bilinear=True, mup=NO_MUP, config_args=("gamma", "p"),
         from_dims={"train_len": lambda dims: dims.train_len})(LogNPower)
register("n_power", bilinear=True, mup=NO_MUP, config_args=("gamma", "a"),
         from_dims={"train_len": lambda dims: dims.train_len})(NPower)


@dataclasses.dataclass(frozen=True)
class ScaleInvariant:
  """l_ij = a_t (q_i . k_j) / sqrt(d) + m_t, t = i - j: scale-invariant attention.

  Anson, Wang & Aitchison 2025, "Scale-invariant attention" (arXiv 2505.17083,
  NeurIPS 2025): with Gaussian logits, multiplying the logit of a key t tokens
  back by a_t and adding m_t, where

      a_t = sqrt(2 [log(t / tau + 1) - log alpha + beta / alpha]),
      m_t = -a_t^2 + beta / alpha,      alpha = beta = e^(1/2)  (a_0 = 1, m_0 = 0),

  i.e. a_t = sqrt(2 log(1 + t/tau) + 1) and m_t = -2 log(1 + t/tau), makes the
  expected total attention of every range [t, t Delta) of past tokens about
  constant (scale-invariant total attention) and its entropy grow slower than
  log t (scale-invariant sparsity). tau (the paper's best is about 10) is the
  local window that stays standard: a_t ~ 1 and m_t ~ 0 for t << tau.

  How it fits the `Scaled` contract: it does not. Both a_t and m_t depend on the
  key (through t = i - j), so neither folds into q (a per-query factor) nor
  drops out of the softmax (a shift constant across a query's keys would).
  The scaling returns the standard `Scaled` and adds `logit_mod(l, i, j)`, a
  per-pair transform of the scaled logits that the reference path and the XLA
  kernel apply to each block of logits before the soft-cap and the mask (no
  T x S array beyond the blocks the kernel already makes). Splash and cuDNN
  take no such transform: the default kernel is the XLA one for this scaling
  everywhere, and implementation="splash" or "cudnn" is an error.

  Causal rule: t depends on positions only, so a prefix's outputs are the full
  sequence's there. Bidirectional attention (which the paper does not define)
  takes t = max(i - j, 0): keys ahead of the query are treated as t = 0.
  """

  tau: float = 10.0

  def __post_init__(self):
    if not self.tau > 0:
      raise ValueError(f"scale_invariant's tau must be > 0, got {self.tau}")

  def __call__(self, q, k, keys):
    return Scaled(q, k, logit_scale=q.shape[-1] ** -0.5)

  def logit_mod(self, logits, i, j):
    """a_t l + m_t for t = max(i - j, 0); `i`, `j` broadcast against `logits`' last two axes."""
    log_t = jnp.log1p(jnp.maximum(i - j, 0).astype(logits.dtype) / self.tau)
    return jnp.sqrt(2.0 * log_t + 1.0) * logits - 2.0 * log_t


# Not bilinear (QK-clip refused): m_t does not scale with the q and k projections.
register("scale_invariant", mup="its logits are multiplied and shifted by functions of the "
         "distance i - j, and no muP rule is defined for that")(ScaleInvariant)
