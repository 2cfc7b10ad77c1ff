"""Splash attention (the TPU kernel) behind `attnscale.core.attention`, in Pallas interpret
mode: every registered scaling, causal and padded, plain and with soft-cap and sink,
equals the reference (values and gradients), and sees neither the future nor padding.

The kernel itself is tested in tests/test_splash_attention.py; here it is the fused
path's (`implementation="splash"`, what the default picks on a TPU), with the
scaling folded into q and the output factor applied after it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import fused as fused_lib
from attnscale.core import scalings
from attnscale.testing import padding_mask, random_qkv

# Interpret mode is slow: these run in the newest-JAX CI leg (.ci/run).
pytestmark = pytest.mark.accelerator

TOL = dict(rtol=5e-5, atol=5e-5)
N, K, T = 4, 2, 10  # grouped-query attention; T is padded to splash's 128 inside
SINK_N = jnp.array([0.5, -1.0, 2.0, 0.0])
OPTIONS = {"plain": {}, "softcap_sink": {"logit_softcap": 1.5, "sink": SINK_N}}
# Splash takes every scaling but one with a per-pair logit transform (scale_invariant),
# which runs the XLA kernel on every platform (tests/test_length_scalings_critical.py).
SPLASH_SCALINGS = [name for name in scalings.names()
                   if not hasattr(scalings.get(name), "logit_mod")]


def _attend(name, q, k, v, implementation, options, **kw):
  return attnscale.attention(q, k, v, scale_fn=scalings.get(name),
                             implementation=implementation, **OPTIONS[options], **kw)


@pytest.mark.parametrize("name", SPLASH_SCALINGS)
def test_splash_equals_reference(name):
  q, k, v = random_qkv(T=T, S=T, N=N, K=K)
  mask = padding_mask([T, 6], T)
  w = jax.random.normal(jax.random.key(7), q.shape)

  def loss(implementation, options, q, k, v):
    outs = [_attend(name, q, k, v, implementation, options, mask=mask, is_causal=is_causal)
            for is_causal in (True, False)]
    return jnp.sum((outs[0] + 0.5 * outs[1]) * w), outs

  for options in OPTIONS:
    got, want = (jax.jit(jax.value_and_grad(functools.partial(loss, impl, options),
                                            argnums=(0, 1, 2), has_aux=True))(q, k, v)
                 for impl in ("splash", "reference"))
    (_, got_outs), got_grads = got
    (_, want_outs), want_grads = want
    for i, (a, b) in enumerate(zip([*got_outs, *got_grads], [*want_outs, *want_grads])):
      np.testing.assert_allclose(a, b, **TOL, err_msg=f"{options}: output/gradient {i}")


@pytest.mark.parametrize("name", SPLASH_SCALINGS)
def test_splash_sees_no_future_and_no_padding(name):
  q, k, v = random_qkv(T=T, S=T, N=N, K=K)
  attend = jax.jit(functools.partial(_attend, name, implementation="splash",
                                     options="softcap_sink", is_causal=True))
  # Prefix == full: the first 6 queries over the first 6 keys are the full run's first 6.
  full = attend(q, k, v)
  prefix = attend(q[:, :6], k[:, :6], v[:, :6])
  np.testing.assert_allclose(prefix, full[:, :6], **TOL)
  # Padding: keys past each row's length change nothing that any query sees.
  mask = padding_mask([T, 6], T)
  noise = 100 * jax.random.normal(jax.random.key(3), k.shape)
  pad_BS1 = ~np.asarray(mask)[:, 0, 0, :, None, None]
  k2, v2 = jnp.where(pad_BS1, k + noise, k), jnp.where(pad_BS1, v - noise, v)
  np.testing.assert_allclose(attend(q, k2, v2, mask=mask), attend(q, k, v, mask=mask),
                             **TOL)


def test_default_picks_splash_on_tpu_only(monkeypatch):
  args = ((2, 8, 4, 16), (2, 8, 2, 16), jnp.bfloat16, None, "softmax", None, None)
  from attnscale.core import cpu_kernel
  # This CPU: the native kernel where it built, else XLA's.
  assert fused_lib.kernel_for(None, *args) == ("native" if cpu_kernel.available() else "xla")
  monkeypatch.setattr(fused_lib, "target_platform", lambda: "tpu")
  assert fused_lib.kernel_for(None, *args) == "splash"
  sigmoid = (*args[:4], "sigmoid", None, None)
  assert fused_lib.kernel_for(None, *sigmoid) == "xla"  # no sigmoid in splash
  custom = (*args[:3], jnp.ones((1, 1, 8, 8), bool), "softmax", None, None)
  assert fused_lib.kernel_for(None, *custom) == "xla"  # a T x S mask is no segment ids
  monkeypatch.setattr(fused_lib, "target_platform", lambda: "gpu")
  assert fused_lib.kernel_for(None, *args) == "cudnn"
  assert fused_lib.kernel_for(None, *args[:5], 50.0, None) == "xla"  # cuDNN: no soft-cap
  assert fused_lib.kernel_for(None, (2, 8, 4, 16), (2, 8, 2, 16), jnp.float32,
                              None, "softmax", None, None) == "xla"  # half precision only


def test_splash_refuses_what_it_cannot_take():
  q, k, v = random_qkv(T=8, S=8, N=N, K=K)
  with pytest.raises(ValueError, match="normalizer='sigmoid' has no splash kernel"):
    attnscale.attention(q, k, v, normalizer="sigmoid", implementation="splash")
  with pytest.raises(ValueError, match="key \\(padding\\) mask"):
    attnscale.attention(q, k, v, mask=jnp.ones((1, 1, 8, 8), bool), implementation="splash")
