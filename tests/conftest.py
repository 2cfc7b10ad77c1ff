"""Shared fixtures: random q, k, v and every registered scaling with test params."""

import jax
import jax.numpy as jnp
import pytest

from attnscale import scalings

# (id, name, params): every registered name at least once, plus variants.
SCALING_CASES = [
    ("standard", "standard", {}),
    ("none", "none", {}),
    ("key_norm_sum", "key_norm_sum", {}),
    ("key_norm_mean", "key_norm_mean", {}),
    ("key_norm_power_2", "key_norm_power", {"p": 2.0}),
    ("key_norm_power_0.5", "key_norm_power", {"p": 0.5}),
    ("cosine", "cosine", {"temperature": 6.0}),
    ("qk_layernorm", "qk_layernorm", {}),
    ("fully_scaled", "fully_scaled", {}),
    ("unit_scaled", "unit_scaled", {}),
]


def test_cases_cover_registry():
  assert {name for _, name, _ in SCALING_CASES} == set(scalings.names())


def scaling_params(ids=None):
  return [pytest.param(name, params, id=i) for i, name, params in SCALING_CASES
          if ids is None or i in ids]


def random_qkv(seed=0, B=2, T=12, S=12, N=4, K=2, H=8, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(kq, (B, T, N, H), dtype)
  k = jax.random.normal(kk, (B, S, K, H), dtype)
  v = jax.random.normal(kv, (B, S, K, H), dtype)
  return q, k, v


def padding_mask(lengths, S):
  """[B, 1, 1, S] key mask: True for the first lengths[b] keys."""
  return (jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None])[:, None, None, :]
