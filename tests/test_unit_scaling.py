"""Unit scaling: exact gradient rules, unit std at init, and the "umup" attention (u-muP's, formerly "unit_scaled")."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale import scalings
from attnscale import unit_scaling as us

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

EXACT = dict(rtol=1e-6, atol=1e-6)
STAT_TOL = 0.1  # |std - 1| at init, the unit-scaling library's statistical tests.


def normal(seed, shape):
  # numpy's generator: jax.random would compile a sampler for every shape (slow on CPU).
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


def vjp(f, *args, seed=99):
  """Output and input gradients of f under a random unit-normal cotangent."""
  out, pullback = jax.vjp(f, *args)
  return out, pullback(normal(seed, out.shape))


# ---------------------------------------------------------------------------
# scale_fwd / scale_bwd and the residual ops: exact formulas.


def test_scale_fwd_and_scale_bwd_are_identity_one_way():
  x, g = normal(0, (5, 3)), normal(1, (5, 3))
  out, pullback = jax.vjp(lambda x: us.scale_fwd(x, 3.0), x)
  np.testing.assert_array_equal(out, 3.0 * x)
  np.testing.assert_array_equal(pullback(g)[0], g)
  out, pullback = jax.vjp(lambda x: us.scale_bwd(x, 3.0), x)
  np.testing.assert_array_equal(out, x)
  np.testing.assert_array_equal(pullback(g)[0], 3.0 * g)
  # jax.grad and jit go through the custom rule too.
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: us.scale_bwd(x, 0.5).sum()))(x),
                             0.5 * jnp.ones_like(x))


RULE_CASES = [("umup", 0.3), ("umup", 2.0), ("2023", 0.3)]


def _weights(rule, tau):  # docs/science.md's formulas, written out independently.
  if rule == "umup":
    return tau / math.sqrt(1 + tau**2), 1 / math.sqrt(1 + tau**2)
  return math.sqrt(tau), math.sqrt(1 - tau)


@pytest.mark.parametrize("rule,tau", RULE_CASES)
def test_residual_split_and_add_formulas(rule, tau):
  a, b = _weights(rule, tau)
  x, gr, gs = normal(0, (4, 6)), normal(1, (4, 6)), normal(2, (4, 6))
  (r, s), pullback = jax.vjp(lambda x: us.residual_split(x, tau, rule), x)
  np.testing.assert_array_equal(r, x)
  np.testing.assert_array_equal(s, x)
  np.testing.assert_allclose(pullback((gr, gs))[0], a * gr + b * gs, **EXACT)
  y, pullback = jax.vjp(lambda r, s: us.residual_add(r, s, tau, rule), gr, gs)
  np.testing.assert_allclose(y, a * gr + b * gs, **EXACT)
  for got in pullback(x):
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("rule,tau", RULE_CASES)
def test_residual_apply_dx_is_plain_autodiff_and_branch_weights_scaled(rule, tau):
  a, b = _weights(rule, tau)
  x, w = normal(0, (4, 6)), normal(1, (6, 6))
  f = lambda w, x: jnp.tanh(x @ w)
  y, (gw, gx) = vjp(lambda w, x: us.residual_apply(functools.partial(f, w), x, tau, rule),
                    w, x)
  y_plain, (gw_plain, gx_plain) = vjp(lambda w, x: a * f(w, x) + b * x, w, x)
  if rule == "umup":  # The u-muP form as docs/science.md writes it.
    np.testing.assert_allclose(y, (tau * f(w, x) + x) / math.sqrt(1 + tau**2), **EXACT)
  np.testing.assert_allclose(y, y_plain, **EXACT)
  np.testing.assert_allclose(gx, gx_plain, **EXACT)
  # Weights inside the branch: plain autodiff times 1/a (u-muP: sqrt(1 + tau^2)/tau).
  np.testing.assert_allclose(gw, gw_plain / a, rtol=1e-5, atol=1e-6)


def test_residual_rejects_bad_tau_and_rule():
  with pytest.raises(ValueError, match="0 <= tau <= 1"):
    us.residual_split(jnp.ones(3), 1.5, rule="2023")
  with pytest.raises(ValueError, match="rule must be one of"):
    us.residual_add(jnp.ones(3), jnp.ones(3), 0.5, rule="2022")


def test_tau_rule_default_is_one_over_sqrt_l_plus_i():
  L = 4
  rule = us.transformer_residual_scaling_rule()
  np.testing.assert_allclose([rule(i, 2 * L) for i in range(2 * L)],
                             [1 / math.sqrt(L + i) for i in range(2 * L)], rtol=1e-12)


@pytest.mark.parametrize("mult,ratio", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.25)])
def test_tau_rule_variance_shares(mult, ratio):
  # Compose the u-muP residuals: the final stream's variance splits as embedding :
  # all branches = 1 : 2 mult^2 and attention : MLP = ratio^2 : 1, whatever the depth.
  L = 3
  rule = us.transformer_residual_scaling_rule(mult, ratio)
  shares = [1.0]  # embedding first
  for i in range(2 * L):
    a, b = us.residual_weights(rule(i, 2 * L))
    shares = [s * b**2 for s in shares] + [a**2]
  emb, attn, mlp = shares[0], sum(shares[1::2]), sum(shares[2::2])
  np.testing.assert_allclose(emb + attn + mlp, 1.0, rtol=1e-12)
  np.testing.assert_allclose((attn + mlp) / emb, 2 * mult**2, rtol=1e-12)
  np.testing.assert_allclose(attn / mlp, ratio**2, rtol=1e-12)
  np.testing.assert_allclose(shares[1:], np.repeat([attn / L], 2 * L) *
                             np.tile([1.0, 1 / ratio**2], L), rtol=1e-12)


def test_attention_residual_weight():
  np.testing.assert_allclose(us.attention_residual_weight(256), math.sqrt(math.e / 256))
  # The 2023 rule's branch/skip ratio sqrt(tau/(1 - tau)) is the same sqrt(e/n).
  tau = us.attention_residual_weight(256, rule="2023")
  np.testing.assert_allclose(math.sqrt(tau / (1 - tau)), math.sqrt(math.e / 256))
  # Causal: n_eff = n / H_n, so the weight is larger than at n.
  assert us.attention_residual_weight(256, is_causal=True) > us.attention_residual_weight(256)


# ---------------------------------------------------------------------------
# Unit-scaled ops: output and gradient std about 1 at init.


def assert_unit(x, what):
  std = float(jnp.std(x))
  assert abs(std - 1) < STAT_TOL, f"{what}: std {std:.3f}"


@pytest.mark.parametrize("fan_in,fan_out,constraint",
                         [(64, 256, None), (128, 128, "to_output_scale")])
def test_linear_unit_scale(fan_in, fan_out, constraint):
  x, w = normal(0, (4, 64, fan_in)), normal(1, (fan_in, fan_out))
  b = jnp.zeros(fan_out)
  y, (gx, gw, gb) = vjp(lambda x, w, b: us.linear(x, w, b, constraint=constraint), x, w, b)
  np.testing.assert_allclose(y, x @ w / math.sqrt(fan_in), rtol=1e-5, atol=1e-5)
  for t, what in ((y, "output"), (gx, "grad x"), (gw, "grad w"), (gb, "grad b")):
    assert_unit(t, what)


def test_linear_default_constraint_ties_grad_x_to_output_scale():
  x, w = normal(0, (64, 256)), normal(1, (256, 64))
  _, (gx_default, _) = vjp(us.linear, x, w)
  _, (gx_separate, _) = vjp(functools.partial(us.linear, constraint=None), x, w)
  np.testing.assert_allclose(gx_default, gx_separate * math.sqrt(64 / 256), rtol=1e-5)


def test_embedding_unit_scale():
  V, D = 64, 64
  ids, table = jnp.asarray(np.random.default_rng(0).integers(0, V, (8, 256))), normal(1, (V, D))
  y, (g_table,) = vjp(lambda t: us.embedding(ids, t), table)
  np.testing.assert_array_equal(y, table[ids])
  assert_unit(y, "output")
  assert_unit(g_table, "grad table")


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norms_unit_scale(norm):
  x, scale = normal(0, (64, 1024)), jnp.ones(1024)
  y, (gx, gs) = vjp(getattr(us, norm), x, scale)
  for t, what in ((y, "output"), (gx, "grad x"), (gs, "grad scale")):
    assert_unit(t, what)
  if norm == "layer_norm":
    _, (_, _, gb) = vjp(us.layer_norm, x, scale, jnp.zeros(1024))
    assert_unit(gb, "grad bias")


def test_gelu_constants_and_unit_scale():
  np.testing.assert_allclose(us.gelu_scales(1.0), (0.588, 0.675), atol=1e-3)
  x = normal(0, (256, 256))
  y, (gx,) = vjp(functools.partial(us.gelu, constraint=None), x)
  np.testing.assert_allclose(y, jax.nn.gelu(x, approximate=False) / 0.5879, rtol=1e-3)
  assert_unit(y, "output")
  assert_unit(gx, "grad x")
  # A u-muP input multiplier: the constants follow it.
  y, (gx,) = vjp(functools.partial(us.gelu, mult=3.0, constraint=None), x)
  assert_unit(y, "output, mult=3")
  assert_unit(gx, "grad x, mult=3")
  # The library's default constraint: grad scale = output scale, grad std 0.675/0.588.
  _, (gx_default,) = vjp(us.gelu, x)
  np.testing.assert_allclose(jnp.std(gx_default), 0.6752 / 0.5879, rtol=0.05)


def test_softmax_cross_entropy_real_loss_unit_grad():
  V, rng = 256, np.random.default_rng(1)
  logits, labels = normal(0, (4, 32, V)), rng.integers(0, V, (4, 32))
  # The plain mean loss and its gradient (softmax - onehot) / batch_size, in float64.
  logp = np.asarray(logits, np.float64)
  logp = logp - logp.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  plain = -np.take_along_axis(logp, labels[..., None], -1).mean()
  g_plain = (np.exp(logp) - np.eye(V)[labels]) / labels.size
  loss, g = jax.value_and_grad(lambda l: us.softmax_cross_entropy(l, jnp.asarray(labels)))(logits)
  np.testing.assert_allclose(loss, plain, rtol=1e-6)
  np.testing.assert_allclose(g, g_plain * labels.size * V / math.sqrt(V - 1), rtol=1e-4,
                             atol=1e-5)
  assert_unit(g, "grad logits")
  np.testing.assert_allclose(us.softmax_cross_entropy(logits, jnp.asarray(labels), "sum"),
                             labels.size * plain, rtol=1e-5)


# ---------------------------------------------------------------------------
# The "umup" attention scaling (registered as "unit_scaled" before).


def qkv(seed=0, B=2, T=12, N=4, K=2, H=8):
  return normal(seed, (B, T, N, H)), normal(seed + 1, (B, T, K, H)), normal(seed + 2, (B, T, K, H))


def test_unit_scaled_is_registered_and_documented():
  assert "umup" in scalings.names()
  f = scalings.get("umup", mult=2.0)
  assert isinstance(f, us.UnitScaledAttention) and f.mult == 2.0
  assert "mult/d" in type(f).__doc__ and "2024" in type(f).__doc__
  # mult = sqrt(d) is the standard logit scale 1/sqrt(d).
  q, k, _ = qkv()
  _, p_std = attnscale.attention_weights(q, k)
  _, p_us = attnscale.attention_weights(q, k, scale_fn=scalings.get("umup",
                                                                      mult=8**0.5))
  np.testing.assert_allclose(p_us, p_std, rtol=1e-5, atol=1e-6)


def test_unit_scaled_reference_equals_fused():
  # Causal and padded (and grouped-query): n_i is a prefix count that stops at the padding.
  q, k, v = qkv()
  is_causal, mask = True, (jnp.arange(12)[None] < jnp.array([12, 5])[:, None])[:, None, None, :]
  f = scalings.get("umup")

  def loss(impl, q, k, v):
    out = attnscale.attention(q, k, v, scale_fn=f, mask=mask, is_causal=is_causal,
                              implementation=impl)
    return jnp.sum(out * normal(7, out.shape)), out

  results = {}
  for impl in ("reference", None):
    (_, out), grads = jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1, 2),
                                         has_aux=True)(q, k, v)
    results[impl] = (out, *grads)
  for got, want in zip(results[None], results["reference"]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", None])
def test_unit_scaled_no_future_leak(implementation):
  q, k, v = qkv()
  f = scalings.get("umup")
  out = attnscale.attention(q, k, v, scale_fn=f, is_causal=True, implementation=implementation)
  i = 5  # Change every key and value after position i.
  k2 = k.at[:, i + 1:].set(normal(10, k[:, i + 1:].shape) * 3)
  v2 = v.at[:, i + 1:].set(normal(11, v[:, i + 1:].shape) * 3)
  out2 = attnscale.attention(q, k2, v2, scale_fn=f, is_causal=True,
                             implementation=implementation)
  np.testing.assert_array_equal(out2[:, :i + 1], out[:, :i + 1])
  assert not np.allclose(out2[:, i + 1:], out[:, i + 1:])


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mult", [1.0, 8.0])  # 8 = sqrt(d): the standard logits.
def test_unit_scaled_output_unit_at_init(is_causal, mult):
  n, d = 256, 64
  q, k, v = (normal(s, (2, n, 4, d)) for s in (0, 1, 2))
  out = attnscale.attention(q, k, v, scale_fn=scalings.get("umup", mult=mult),
                            is_causal=is_causal)
  if is_causal:
    out = out[:, 15:]  # positions with n_i >= 16
  assert_unit(out, f"attention output (causal={is_causal}, mult={mult})")
