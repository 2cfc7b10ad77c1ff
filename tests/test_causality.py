"""No scaling lets a causal query see the future, nor any query see padding."""

import jax
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings
from attnscale.testing import padding_mask, random_qkv, scaling_params

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

IMPLEMENTATIONS = ["reference", None]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name,params", scaling_params())
def test_no_future_leak(name, params, implementation):
  q, k, v = random_qkv(T=10, S=10, K=2)
  f = scalings.get(name, **params)
  attend = jax.jit(lambda q, k, v: attnscale.attention(
      q, k, v, scale_fn=f, is_causal=True, implementation=implementation))
  base = np.asarray(attend(q, k, v))
  for i in (0, 3, 8):
    # Change keys and values after position i, with a large scale so that any
    # key-norm sum over the whole sequence would move.
    noise_k, noise_v = random_qkv(seed=i + 1, T=10, S=10, K=2)[1:]
    k2 = k.at[:, i + 1:].set(10 * noise_k[:, i + 1:])
    v2 = v.at[:, i + 1:].set(10 * noise_v[:, i + 1:])
    out = np.asarray(attend(q, k2, v2))
    np.testing.assert_array_equal(out[:, :i + 1], base[:, :i + 1])
    assert not np.allclose(out[:, i + 1:], base[:, i + 1:])  # the change was real


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name,params", scaling_params())
def test_causal_gradients_never_reach_the_past(name, params, implementation):
  # d out_i / d (k_j, v_j) == 0 for j > i: the nanodo-style causality check.
  q, k, v = random_qkv(B=1, T=8, S=8)
  f = scalings.get(name, **params)
  i = 4

  def out_i(k, v):
    out = attnscale.attention(q, k, v, scale_fn=f, is_causal=True,
                              implementation=implementation)
    return out[:, i].sum()

  gk, gv = jax.grad(out_i, argnums=(0, 1))(k, v)
  assert np.all(np.asarray(gk[:, i + 1:]) == 0) and np.all(np.asarray(gv[:, i + 1:]) == 0)
  assert np.any(np.asarray(gv[:, :i + 1]) != 0)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name,params", scaling_params())
def test_no_padding_leak(name, params, implementation, is_causal):
  q, k, v = random_qkv(T=10, S=10, K=2)
  lengths = [10, 6]
  mask = padding_mask(lengths, 10)
  f = scalings.get(name, **params)
  attend = jax.jit(lambda k, v: attnscale.attention(
      q, k, v, scale_fn=f, mask=mask, is_causal=is_causal, implementation=implementation))
  base = np.asarray(attend(k, v))
  # Padded keys: huge, zero, or random; none may change anything.
  for k_pad, v_pad in ((100.0, -50.0), (0.0, 0.0)):
    out = np.asarray(attend(k.at[1, 6:].set(k_pad), v.at[1, 6:].set(v_pad)))
    np.testing.assert_array_equal(out, base)


@pytest.mark.parametrize("name,params", scaling_params())
def test_padding_equals_truncation(name, params):
  # A padded sequence of length 6 attends exactly like the unpadded 6 keys.
  q, k, v = random_qkv(B=1, T=6, S=10, K=2)
  f = scalings.get(name, **params)
  padded = attnscale.attention(q, k, v, scale_fn=f, mask=padding_mask([6], 10))
  short = attnscale.attention(q, k[:, :6], v[:, :6], scale_fn=f)
  np.testing.assert_allclose(padded, short, rtol=1e-5, atol=1e-5)


def test_prefix_equals_generation():
  # A causal model's output at position i equals running on the prefix alone:
  # what generation computes. (A whole-sequence scale would break this.)
  q, k, v = random_qkv(T=10, S=10)
  for name in scalings.names():
    f = scalings.get(name)  # every default, cosine's temperature from n_i included
    full = attnscale.attention(q, k, v, scale_fn=f, is_causal=True)
    for i in (0, 4):
      prefix = attnscale.attention(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1], scale_fn=f,
                                   is_causal=True)
      np.testing.assert_allclose(full[:, :i + 1], prefix, rtol=1e-5, atol=1e-5,
                                 err_msg=name)
