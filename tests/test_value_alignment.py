"""diagnostics.value_alignment: the shared-K/V measures (weight on self, on similar values)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnscale.evaluation import diagnostics


def _qkv(B=2, T=16, N=4, K=4, H=8, seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, N, H)), jax.random.normal(kk, (B, T, K, H)),
          jax.random.normal(kv, (B, T, K, H)))


def test_uniform_attention_numbers():
  """q = 0: uniform causal weights, so p_ii = 1/(i+1) and no correlation with anything."""
  q, k, v = _qkv()
  r = diagnostics.value_alignment(jnp.zeros_like(q), k, v, is_causal=True, min_keys=4)
  T = q.shape[1]
  assert float(r["self_weight"]) == pytest.approx(np.mean([1 / (i + 1) for i in range(3, T)]),
                                                  rel=1e-5)
  assert abs(float(r["corr_qv"])) < 1e-5 and abs(float(r["corr_vv"])) < 1e-5


def test_shared_kv_scores_by_value():
  """k = v: the logit is q . v_j, so weights track cos(q, v_j) far more than with
  independent keys; grouped-query heads read their own key/value head."""
  q, k, v = _qkv(K=2)
  shared = diagnostics.value_alignment(q, v, v, is_causal=True)
  separate = diagnostics.value_alignment(q, k, v, is_causal=True)
  assert float(shared["corr_qv"]) > 0.5 > abs(float(separate["corr_qv"]))
  assert shared["heads"]["corr_qv"].shape == (4,)


def test_padding_queries_and_keys_excluded():
  """Padded keys are invisible and padded queries do not count."""
  q, k, v = _qkv(T=12)
  real_BT = jnp.arange(12)[None, :] < jnp.array([[12], [8]])
  mask = real_BT[:, None, None, :]
  r = diagnostics.value_alignment(q, k, v, mask=mask, query_mask_BT=real_BT)
  # Row 1 cut to its 8 real tokens gives the same per-query values.
  short = diagnostics.value_alignment(q[1:, :8], k[1:, :8], v[1:, :8])
  full = diagnostics.value_alignment(q[:1], k[:1], v[:1])
  expect = (12 * full["self_weight"] + 8 * short["self_weight"]) / 20
  assert float(r["self_weight"]) == pytest.approx(float(expect), rel=1e-5)
