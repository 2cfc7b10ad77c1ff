"""The critical-length family (log_n_power, n_power) and scale-invariant attention:
what each promises beyond the registry-wide leak, prefix and fused == reference tests."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import fused as fused_lib
from attnscale.core import scalings
from attnscale.testing import random_qkv

TOL = dict(rtol=1e-5, atol=1e-6)


def _weights(name, q, k, **params):
  return np.asarray(attnscale.attention_weights(q, k, scale_fn=scalings.get(name, **params),
                                                is_causal=True)[1])


@pytest.mark.parametrize("name,params", [("log_n_power", {"p": 0.5}), ("log_n_power", {"p": 1.0}),
                                         ("log_n_power", {"p": 2.0}), ("n_power", {"a": 0.3}),
                                         ("n_power", {"a": -0.2})])
def test_standard_at_the_training_length(name, params):
  # f(n)/f(L) = 1 at n_i = L: the query that sees exactly L keys gets standard's weights.
  L = 7
  q, k, _ = random_qkv(T=12, S=12)
  got = _weights(name, q, k, train_len=L, **params)
  want = _weights("standard", q, k)
  np.testing.assert_allclose(got[:, :, L - 1], want[:, :, L - 1], **TOL)
  assert not np.allclose(got[:, :, L + 3], want[:, :, L + 3])  # and it moves away from L


@pytest.mark.parametrize("name,params", [("log_n_power", {"p": 0.0}), ("n_power", {"a": 0.0})])
def test_zero_exponent_is_standard_everywhere(name, params):
  q, k, _ = random_qkv(T=12, S=12)
  for normalise in (True, False):
    np.testing.assert_allclose(_weights(name, q, k, train_len=5, normalise=normalise, **params),
                               _weights("standard", q, k), **TOL)


def test_laws_scale_as_stated():
  # s_i sqrt(d) = gamma f(n_i) / f(L), or gamma f(n_i) with normalise=False.
  q, k, _ = random_qkv(B=1, T=9, S=9, N=2, K=2, H=4)
  keys = attnscale.VisibleKeys(None, True, 9, 9, 2, 2)
  n = np.arange(1, 10, dtype=np.float64)[None, :, None]
  cases = [("log_n_power", dict(gamma=1.5, p=2.0, train_len=4), 1.5 * np.log(n) ** 2
            / math.log(4) ** 2),
           ("log_n_power", dict(gamma=1.5, p=0.5, normalise=False), 1.5 * np.log(n) ** 0.5),
           ("n_power", dict(gamma=0.5, a=0.25, train_len=4), 0.5 * (n / 4) ** 0.25),
           ("n_power", dict(a=0.25, normalise=False), n ** 0.25)]
  for name, params, want in cases:
    s = np.asarray(scalings.get(name, **params)(q, k, keys).logit_scale) * 2.0  # sqrt(4)
    np.testing.assert_allclose(np.broadcast_to(s, (1, 9, 2)), np.broadcast_to(want, (1, 9, 2)),
                               rtol=1e-5, err_msg=name)


def test_log_law_is_qwens_past_the_training_length():
  # p = 1 is log_L(n_i); log_n_ratio is the same floored at 1 (standard below L).
  q, k, _ = random_qkv(T=12, S=12)
  got = _weights("log_n_power", q, k, train_len=4)
  want = _weights("log_n_ratio", q, k, train_len=4)
  np.testing.assert_allclose(got[:, :, 3:], want[:, :, 3:], **TOL)
  assert not np.allclose(got[:, :, 1:3], want[:, :, 1:3])  # flatter, not floored, below L


def test_scale_invariant_is_the_papers_transform():
  # a_t = sqrt(2 [log(t/tau + 1) - log alpha + beta/alpha]), m_t = -a_t^2 + beta/alpha,
  # alpha = beta = e^(1/2) (arXiv 2505.17083), so a_0 = 1 and m_0 = 0.
  tau, alpha = 10.0, math.exp(0.5)
  f = scalings.get("scale_invariant", tau=tau)
  t = jnp.arange(0, 200, 7, dtype=jnp.float32)
  logits = jnp.linspace(-3.0, 3.0, t.size)
  a_t = np.sqrt(2 * (np.log(np.asarray(t) / tau + 1) - math.log(alpha) + alpha / alpha))
  m_t = -a_t**2 + alpha / alpha
  got = np.asarray(f.logit_mod(logits, t, jnp.zeros_like(t)))
  np.testing.assert_allclose(got, a_t * np.asarray(logits) + m_t, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(f.logit_mod(logits, 0, 0)), logits)  # t = 0: identity


def test_scale_invariant_with_huge_tau_is_standard():
  q, k, v = random_qkv(T=10, S=10)
  for impl in ("reference", None):
    got = attnscale.attention(q, k, v, scale_fn=scalings.get("scale_invariant", tau=1e12),
                              is_causal=True, implementation=impl)
    want = attnscale.attention(q, k, v, is_causal=True, implementation=impl)
    np.testing.assert_allclose(got, want, **TOL)


def test_scale_invariant_takes_the_xla_kernel_only():
  f = scalings.get("scale_invariant")
  args = ((2, 8, 4, 16), (2, 8, 2, 16), jnp.bfloat16, None, "softmax", None, None)
  assert fused_lib.kernel_for(None, *args, logit_mod=f.logit_mod) == "xla"
  for impl in ("splash", "cudnn"):
    with pytest.raises(ValueError, match="per-pair logit transform"):
      fused_lib.kernel_for(impl, *args, logit_mod=f.logit_mod)


def test_bad_fields_are_one_line_errors():
  for name, params, match in (("log_n_power", {"p": -1.0}, "p must be >= 0"),
                              ("log_n_power", {"train_len": 1}, "train_len must be >= 2"),
                              ("n_power", {"a": float("nan")}, "a must be a finite"),
                              ("scale_invariant", {"tau": 0.0}, "tau must be > 0")):
    with pytest.raises(ValueError, match=match):
      scalings.get(name, **params)
  assert not scalings.entry("scale_invariant").bilinear  # m_t: QK-clip would be wrong
