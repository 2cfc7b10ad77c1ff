"""Softpick, ReLU/L, stick-breaking, FoX's forget gate and differential attention, each
against its paper's formula written out independently (numpy loops), across
grouped-query shapes: weights, outputs, stats, no future gate leak, prefix == full,
and one-line refusals. (Fused == reference for every scaling, leaks and padding:
tests/test_kernel_options.py, which takes them with the other options.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import normalizers, scalings, xla_attention
from attnscale.core.differential import differential_attention
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

TOL = dict(rtol=2e-5, atol=2e-5)
NEW = ("softpick", "relu", "stickbreaking")
SHAPES = [(4, 4), (4, 2), (4, 1)]  # (N, K): multi-head, grouped-query, multi-query


@pytest.fixture(autouse=True)
def two_causal_blocks(monkeypatch):
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)  # T = 10: two causal blocks


def _written_out(normalizer, logits_TS, visible_TS):
  """p_ij by the papers' formulas, one row at a time, float64."""
  p = np.zeros_like(logits_TS, dtype=np.float64)
  for i in range(logits_TS.shape[0]):
    keys = np.flatnonzero(visible_TS[i])
    x = logits_TS[i, keys].astype(np.float64)
    if normalizer == "softpick":  # Zuhri et al.: relu(e^x - 1) / (sum |e^x - 1| + eps)
      p[i, keys] = np.maximum(np.expm1(x), 0) / (np.abs(np.expm1(x)).sum() + 1e-8)
    elif normalizer == "relu":  # Wortsman et al.: relu(x) / L
      p[i, keys] = np.maximum(x, 0) / len(keys)
    else:  # Tan et al.: beta_j prod_{k > j} (1 - beta_k), the nearest key first
      beta = 1 / (1 + np.exp(-x))
      for a, j in enumerate(keys):
        p[i, j] = beta[a] * np.prod(1 - beta[a + 1:])
  return p


@pytest.mark.parametrize("normalizer", NEW)
def test_weights_are_the_papers(normalizer):
  q, k, _ = random_qkv(T=10, S=10, N=4, K=2)
  mask = padding_mask([10, 6], 10)
  logits, probs = attnscale.attention_weights(2 * q, k, normalizer=normalizer, mask=mask,
                                              is_causal=True)
  visible = np.isfinite(np.asarray(logits))
  for b in range(2):
    for n in range(4):
      want = _written_out(normalizer, np.asarray(logits[b, n]), visible[b, n])
      np.testing.assert_allclose(probs[b, n], want, rtol=1e-5, atol=1e-6, err_msg=(b, n))
  assert np.all(np.asarray(probs)[~visible] == 0)
  assert np.all(np.asarray(probs).sum(-1) <= 1 + 1e-6) or normalizer == "relu"


@pytest.mark.parametrize("normalizer", NEW)
@pytest.mark.parametrize("N, K", SHAPES)
def test_output_is_weights_times_values(normalizer, N, K):
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  for name in ("standard", "key_norm_sum"):  # key_norm_sum: an output factor c_i too
    kw = dict(scale_fn=scalings.get(name), normalizer=normalizer, is_causal=True)
    logits, probs = attnscale.attention_weights(q, k, **kw)
    ref = attnscale.attention(q, k, v, implementation="reference", **kw)
    fused = attnscale.attention(q, k, v, **kw)
    np.testing.assert_allclose(fused, ref, **TOL)
    v_BNSH = jnp.repeat(v, N // K, axis=2).transpose(0, 2, 1, 3)
    z = jnp.einsum("bnts,bnsh->btnh", probs, v_BNSH)
    if name == "standard":
      np.testing.assert_allclose(ref, z, **TOL)
    else:  # the same weights, times a per-query factor: parallel outputs
      cos = jnp.sum(ref * z, -1) / (jnp.linalg.norm(ref, axis=-1) * jnp.linalg.norm(z, axis=-1))
      np.testing.assert_allclose(jnp.abs(cos)[jnp.linalg.norm(z, axis=-1) > 1e-6], 1, atol=1e-4)


def test_softpick_is_stable_far_from_zero():
  # Logits of +-200: e^200 overflows float32, the stable form does not; all below 0
  # weighs nothing (m floored at 0 keeps e^-m finite).
  x = jnp.array([[200.0, 199.0, -5.0], [-200.0, -300.0, -150.0]])
  p = normalizers.weights("softpick", x, None)
  assert np.all(np.isfinite(np.asarray(p)))
  np.testing.assert_allclose(p[0, :2], [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1))],
                             rtol=1e-6)
  assert np.all(np.asarray(p[1]) == 0)
  g = jax.grad(lambda x: normalizers.weights("softpick", x, None)[0, 0])(x)
  assert np.all(np.isfinite(np.asarray(g)))


def test_stickbreaking_is_stable_far_from_zero():
  # A key with logit +100 takes (about) the whole stick; the keys behind it nothing.
  x = jnp.array([[-3.0, 5.0, 100.0, -100.0]])
  p = normalizers.weights("stickbreaking", x, None)
  assert np.all(np.isfinite(np.asarray(p)))
  np.testing.assert_allclose(p[0, 2], 1.0, rtol=1e-6)
  assert float(p[0, :2].sum()) < 1e-30
  g = jax.grad(lambda x: normalizers.weights("stickbreaking", x, None).sum())(x)
  assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("normalizer", NEW)
def test_stats_match_the_reference(normalizer):
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  kw = dict(normalizer=normalizer, is_causal=True, mask=padding_mask([10, 6], 10))
  _, got = attnscale.attention(q, k, v, return_stats=True, **kw)
  _, want = attnscale.attention(q, k, v, implementation="reference", return_stats=True, **kw)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, **TOL)
  # The definitions (AttentionStats): the largest visible logit, -sum p log p.
  logits, probs = attnscale.attention_weights(q, k, **kw)
  p = np.asarray(probs)
  entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(np.asarray(want.entropy_BTN).transpose(0, 2, 1), entropy, **TOL)
  np.testing.assert_allclose(np.asarray(want.max_logit_BTN).transpose(0, 2, 1),
                             np.max(np.asarray(logits), -1), **TOL)


def _forget_gate(B, T, N, seed=3):
  return jax.nn.log_sigmoid(1.0 + jax.random.normal(jax.random.key(seed), (B, T, N)))


@pytest.mark.parametrize("N, K", SHAPES)
def test_forget_gate_bias_is_foxs(N, K):
  # FoX: l_ij + sum_{l=j+1}^{i} log f_l, then softmax (any normaliser takes it).
  q, k, _ = random_qkv(T=10, S=10, N=N, K=K)
  lf = _forget_gate(2, 10, N)
  plain, _ = attnscale.attention_weights(q, k, is_causal=True)
  logits, probs = attnscale.attention_weights(q, k, is_causal=True, log_forget=lf)
  lf_BNT = np.asarray(lf, np.float64).transpose(0, 2, 1)
  d = np.full((2, N, 10, 10), -np.inf)
  for i in range(10):
    for j in range(i + 1):
      d[:, :, i, j] = lf_BNT[:, :, j + 1:i + 1].sum(-1)
  np.testing.assert_allclose(logits, np.asarray(plain, np.float64) + d, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(probs, jax.nn.softmax(jnp.asarray(np.asarray(plain) + d), -1),
                             **TOL)


@pytest.mark.parametrize("normalizer", ("softmax", *NEW))
def test_forget_gate_no_future_leak_and_prefix(normalizer):
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  lf = _forget_gate(2, 10, 4)
  attend = lambda q, k, v, lf: attnscale.attention(q, k, v, is_causal=True, log_forget=lf,
                                                   normalizer=normalizer)
  full = attend(q, k, v, lf)
  i = 4
  np.testing.assert_allclose(attend(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1], lf[:, :i + 1]),
                             full[:, :i + 1], **TOL)
  # Query i's output has no gradient from any later gate, key or value.
  grads = jax.grad(lambda k, v, lf: attend(q, k, v, lf)[:, i].sum(), argnums=(0, 1, 2))(k, v, lf)
  for g in grads:
    assert np.all(np.asarray(g[:, i + 1:]) == 0)
  assert np.any(np.asarray(grads[2][:, 1:i + 1]) != 0)


def test_forget_gate_of_zero_is_no_gate():
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  for normalizer in ("softmax", *NEW):
    kw = dict(is_causal=True, normalizer=normalizer)
    np.testing.assert_allclose(
        attnscale.attention(q, k, v, log_forget=jnp.zeros((2, 10, 4)), **kw),
        attnscale.attention(q, k, v, **kw), **TOL)


@pytest.mark.parametrize("normalizer, N, K", [("softmax", 4, 2), ("softpick", 4, 1)])
def test_differential_is_two_maps(normalizer, N, K):
  # (p1 - lambda p2) v: two attention calls, one subtracted (Ye et al. 2025).
  q1, k1, v = random_qkv(T=10, S=10, N=N, K=K)
  q2, k2, _ = random_qkv(seed=5, T=10, S=10, N=N, K=K)
  lam = jnp.linspace(0.2, 0.8, N)
  kw = dict(scale_fn=scalings.get("key_norm_sum"), is_causal=True, normalizer=normalizer,
            mask=padding_mask([10, 6], 10))

  def two_calls(q1, q2, k1, k2, v, lam):
    one = lambda q, k: attnscale.attention(q, k, v, implementation="reference", **kw)
    return one(q1, k1) - lam.reshape(1, 1, N, 1) * one(q2, k2)

  args = (q1, q2, k1, k2, v, lam)
  np.testing.assert_allclose(differential_attention(*args, **kw), two_calls(*args), **TOL)
  w = jax.random.normal(jax.random.key(9), q1.shape)
  grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=tuple(range(6)))(*args)
  for got, want in zip(grad(lambda *a: differential_attention(*a, **kw)), grad(two_calls)):
    np.testing.assert_allclose(got, want, **TOL)


def test_differential_takes_per_head_sink_and_gate():
  q1, k1, v = random_qkv(T=10, S=10, N=4, K=2)
  q2, k2, _ = random_qkv(seed=5, T=10, S=10, N=4, K=2)
  sink, lf = jnp.array([0.5, -1.0, 2.0, 0.0]), _forget_gate(2, 10, 4)
  one = lambda q, k: attnscale.attention(q, k, v, is_causal=True, sink=sink, log_forget=lf)
  got, stats = differential_attention(q1, q2, k1, k2, v, 0.3, is_causal=True, sink=sink,
                                      log_forget=lf, return_stats=True)
  np.testing.assert_allclose(got, one(q1, k1) - 0.3 * one(q2, k2), **TOL)
  assert stats.max_logit_BTN.shape == (2, 10, 8)


@pytest.mark.parametrize("kwargs,match", [
    (dict(normalizer="stickbreaking"), r"normalizer='stickbreaking' needs is_causal=True"),
    (dict(normalizer="softpick", implementation="cudnn", is_causal=True),
     r"normalizer='softpick' has no cuDNN kernel"),
    (dict(normalizer="relu", implementation="splash", is_causal=True),
     r"normalizer='relu' has no splash kernel"),
    (dict(log_forget=jnp.zeros((2, 10, 4))), r"log_forget needs causal self-attention"),
    (dict(log_forget=jnp.zeros((2, 10, 3)), is_causal=True),
     r"log_forget must have shape \[batch, q_len, heads\] = \[2, 10, 4\]"),
    (dict(log_forget=jnp.zeros((2, 10, 4)), is_causal=True, implementation="splash"),
     r"implementation='splash' cannot take log_forget"),
    (dict(normalizer="softpick", sink=0.0), r"sink needs normalizer='softmax'"),
    (dict(normalizer="softmin"), r"normalizer must be one of \('softmax', 'sigmoid', "
                                 r"'softpick', 'relu', 'stickbreaking'\)"),
])
def test_bad_options(kwargs, match):
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  with pytest.raises(ValueError, match=match) as e:
    attnscale.attention(q, k, v, **kwargs)
  assert "\n" not in str(e.value)


def test_kernel_choice_for_the_gate():
  from attnscale.core import fused
  args = ((2, 8, 4, 16), (2, 8, 2, 16), jnp.bfloat16, None, "softmax", None, None)
  assert fused.kernel_for(None, *args, log_forget=True) == "xla"
  for normalizer in NEW:  # no splash kernel for any of them
    from attnscale.core import splash_attention
    assert splash_attention.unsupported_reason(args[0], args[1], normalizer=normalizer,
                                               has_custom_mask=False) is not None


@pytest.mark.parametrize("normalizer", NEW)
def test_bfloat16_runs_close_to_float32(normalizer):
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  kw = dict(normalizer=normalizer, is_causal=True, log_forget=_forget_gate(2, 10, 4))
  want = attnscale.attention(q, k, v, implementation="reference", **kw)
  got = attnscale.attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), **kw)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(got.astype(jnp.float32), want, atol=0.05)
