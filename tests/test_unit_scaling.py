"""Unit scaling: exact gradient rules, unit std at init, and the "umup" attention (u-muP's, formerly "unit_scaled")."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings
from attnscale.numerics import unit_scaling as us

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


def test_linear_bias_is_scaled_with_the_output():
  # unit-scaling 0.3.5: scale_fwd(F.linear(input, weight, bias), 1/sqrt(fan_in)), so
  # the bias is divided by sqrt(fan_in) with the product; its gradient sums the
  # batch and is scaled by 1/sqrt(batch_size).
  fan_in, fan_out, batch = 64, 32, 48
  x, w, b, g = normal(0, (batch, fan_in)), normal(1, (fan_in, fan_out)), normal(2, (fan_out,)), \
      normal(3, (batch, fan_out))
  y, pullback = jax.vjp(lambda x, w, b: us.linear(x, w, b, constraint=None), x, w, b)
  np.testing.assert_allclose(y, (x @ w + b[None]) / math.sqrt(fan_in), rtol=1e-5, atol=1e-5)
  gx, gw, gb = pullback(g)
  np.testing.assert_allclose(gx, g @ w.T / math.sqrt(fan_out), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gw, x.T @ g / math.sqrt(batch), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gb, g.sum(0) / math.sqrt(batch), rtol=1e-5, atol=1e-5)


def test_linear_readout_is_u_mup_readout():
  # linear_readout: scale_power (1, 1/2, 1/2), constraint None: output / fan_in,
  # input gradient / sqrt(fan_out), weight gradient / sqrt(batch_size).
  fan_in, fan_out, batch = 256, 1024, 256
  x, w, g = normal(0, (batch, fan_in)), normal(1, (fan_in, fan_out)), normal(3, (batch, fan_out))
  y, pullback = jax.vjp(us.linear_readout, x, w)
  gx, gw = pullback(g)
  np.testing.assert_allclose(y, x @ w / fan_in, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gx, g @ w.T / math.sqrt(fan_out), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(gw, x.T @ g / math.sqrt(batch), rtol=1e-4, atol=1e-4)
  # The library's test: unit weight gradient, output std 1/sqrt(fan_in).
  assert_unit(gw, "grad w")
  np.testing.assert_allclose(jnp.std(y), fan_in**-0.5, rtol=0.1)


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


def _library_interp(alpha, lower, upper):
  # core/functional.py's logarithmic_interpolation, written out.
  return lower**(1 - alpha) * upper**alpha


@pytest.mark.parametrize("mult", [0.25, 1.0, 4.0])
def test_gelu_library_scales_are_0_3_x_formula(mult):
  # unit-scaling 0.3.5 functional.gelu: alpha = 1/(1 + 0.25/mult^2), output scale
  # from 2 to sqrt(2/(1 - 1/pi)), gradient scale from 2 to sqrt(2), on gelu(mult x)/mult.
  alpha = 1 / (1 + 0.25 / mult**2)
  want = (_library_interp(alpha, 2, math.sqrt(2 / (1 - 1 / math.pi))),
          _library_interp(alpha, 2, math.sqrt(2)))
  np.testing.assert_allclose(us.library_gelu_scales(mult), want, rtol=1e-12)
  x, g = normal(0, (64, 64)), normal(1, (64, 64))
  y, pullback = jax.vjp(lambda x: us.gelu(x, mult=mult, constraint=None, scales="library"), x)
  np.testing.assert_allclose(y, want[0] * jax.nn.gelu(mult * x, approximate=False) / mult,
                             rtol=1e-5, atol=1e-6)
  grad_gelu = jax.vmap(jax.grad(lambda u: jax.nn.gelu(u, approximate=False)))
  np.testing.assert_allclose(pullback(g)[0], want[1] * g * grad_gelu((mult * x).ravel()
                                                                       ).reshape(x.shape),
                             rtol=1e-5, atol=1e-6)
  if mult == 1.0:  # within the library's own tolerance of unit, not exactly unit
    np.testing.assert_allclose(want, (1.7668, 1.5157), atol=1e-4)
    np.testing.assert_allclose(want[0] * us.gelu_scales()[0], 1.0387, atol=1e-3)
  with pytest.raises(ValueError, match="scales must be one of"):
    us.gelu(x, scales="0.2")


@pytest.mark.parametrize("mult", [0.25, 1.0, 4.0])
def test_silu_and_silu_glu_are_0_3_x_formula(mult):
  out_scale = _library_interp(1 / (1 + 0.25 / mult**2), 2, math.sqrt(2 / (1 - 1 / math.pi)))
  grad_scale = _library_interp(1 / (1 + 1 / mult**2), 2, math.sqrt(2))
  x, gate, g = normal(0, (64, 256)), normal(1, (64, 256)), normal(2, (64, 256))
  y, pullback = jax.vjp(lambda x: us.silu(x, mult=mult, constraint=None), x)
  silu = lambda u: u * jax.nn.sigmoid(mult * u)
  np.testing.assert_allclose(y, out_scale * silu(x), rtol=1e-5, atol=1e-6)
  dsilu = jax.vmap(jax.grad(silu))(x.ravel()).reshape(x.shape)
  np.testing.assert_allclose(pullback(g)[0], grad_scale * g * dsilu, rtol=1e-5, atol=1e-6)
  # silu_glu: one scale (the gradient one) forward and on both gradients.
  y, pullback = jax.vjp(lambda x, gate: us.silu_glu(x, gate, mult=mult), x, gate)
  np.testing.assert_allclose(y, grad_scale * x * silu(gate), rtol=1e-5, atol=1e-6)
  gx, ggate = pullback(g)
  np.testing.assert_allclose(gx, grad_scale * g * silu(gate), rtol=1e-5, atol=1e-6)
  dsilu_gate = jax.vmap(jax.grad(silu))(gate.ravel()).reshape(gate.shape)
  np.testing.assert_allclose(ggate, grad_scale * g * x * dsilu_gate, rtol=1e-5, atol=1e-6)
  # The library's statistical tests (unit within 0.1, constraint=None).
  y, (gx,) = vjp(lambda x: us.silu(x, mult=mult, constraint=None), x)
  assert_unit(y, f"silu output, mult={mult}")
  assert_unit(gx, f"silu grad, mult={mult}")
  y, (gx, ggate) = vjp(lambda x, gate: us.silu_glu(x, gate, mult=mult), x, gate)
  for t, what in ((y, "output"), (gx, "grad input"), (ggate, "grad gate")):
    assert_unit(t, f"silu_glu {what}, mult={mult}")


def test_softmax_is_0_3_x_formula_and_unit_at_small_mult():
  n, mult = 4096, 0.25
  alpha = 1 / (1 + 4 / mult**2)
  out_scale = _library_interp(alpha, n, math.sqrt(n))
  grad_scale = _library_interp(alpha, n / mult, math.sqrt(n / mult))
  np.testing.assert_allclose(us.softmax_scales(n, mult), (out_scale, grad_scale), rtol=1e-12)
  x, g = normal(0, (4, n)), normal(1, (4, n))
  y, pullback = jax.vjp(lambda x: us.softmax(x, mult=mult, constraint=None), x)
  np.testing.assert_allclose(y, out_scale * jax.nn.softmax(mult * x, axis=-1), rtol=1e-5)
  _, plain = jax.vjp(lambda x: jax.nn.softmax(mult * x, axis=-1), x)
  np.testing.assert_allclose(pullback(g)[0], grad_scale * plain(g)[0], rtol=1e-4, atol=1e-6)
  # The library's test: unit RMS (softmax outputs are positive) at mult = 1/4.
  rms = lambda t: float(jnp.sqrt(jnp.mean(jnp.square(t))))
  assert abs(rms(y) - 1) < STAT_TOL and abs(rms(pullback(g)[0]) - 1) < STAT_TOL
  # Along another axis, and the default constraint ties the gradient to the output scale.
  y0 = us.softmax(x.T, axis=0, mult=mult)
  np.testing.assert_allclose(y0, out_scale * jax.nn.softmax(mult * x.T, axis=0), rtol=1e-5)


MATMUL_CONSTRAINTS = {
    None: lambda o, l, r: (o, l, r),
    "to_output_scale": lambda o, l, r: (o, o, o),
    "to_left_grad_scale": lambda o, l, r: (l, l, l),
    "to_right_grad_scale": lambda o, l, r: (r, r, r),
    "gmean": lambda o, l, r: ((o * l * r)**(1 / 3),) * 3,
}


@pytest.mark.parametrize("constraint", list(MATMUL_CONSTRAINTS))
def test_matmul_is_library_formula(constraint):
  # functional.matmul: output K^-1/2, left grad N^-1/2, right grad M^-1/2, then
  # apply_constraint over all three (constraints.py).
  M, K, N = 32, 64, 128
  left, right, g = normal(0, (3, M, K)), normal(1, (3, K, N)), normal(2, (3, M, N))
  o, l, r = MATMUL_CONSTRAINTS[constraint](K**-0.5, N**-0.5, M**-0.5)
  y, pullback = jax.vjp(lambda a, b: us.matmul(a, b, constraint=constraint), left, right)
  gl, gr = pullback(g)
  np.testing.assert_allclose(y, o * (left @ right), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gl, l * (g @ jnp.swapaxes(right, -1, -2)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gr, r * (jnp.swapaxes(left, -1, -2) @ g), rtol=1e-5, atol=1e-5)
  if constraint is None:
    for t, what in ((y, "output"), (gl, "grad left"), (gr, "grad right")):
      assert_unit(t, what)


def test_constraints_reject_unknown_and_wrong_arity():
  with pytest.raises(ValueError, match="constraint must be one of"):
    us.linear(jnp.ones((2, 4)), jnp.ones((4, 4)), constraint="to_left_grad_scale")
  with pytest.raises(ValueError, match="constraint must be one of"):
    us.matmul(jnp.ones((2, 4)), jnp.ones((4, 4)), constraint="to_grad_input_scale")


def test_rms_norm_default_eps_is_the_library_s():
  import inspect
  assert inspect.signature(us.rms_norm).parameters["eps"].default == 1e-5
  x = normal(0, (4, 8)) * 1e-3  # small enough that eps matters
  np.testing.assert_allclose(us.rms_norm(x), x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True)
                                                            + 1e-5), rtol=1e-6)


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


def test_cross_entropy_mult_scales_logits_forward_only():
  # functional.cross_entropy: scale_bwd(V/sqrt(V-1)) then scale_fwd(mult): the
  # loss is that of mult * logits, its gradient (softmax(mult l) - onehot) V/sqrt(V-1)
  # with no factor mult and no 1/batch_size.
  V, mult = 64, 2.5
  logits, labels = normal(0, (32, V)), jnp.asarray(np.random.default_rng(2).integers(0, V, 32))
  loss, g = jax.value_and_grad(lambda l: us.softmax_cross_entropy(l, labels, mult=mult))(logits)
  logp = jax.nn.log_softmax(mult * logits)
  np.testing.assert_allclose(loss, -jnp.take_along_axis(logp, labels[:, None], 1).mean(),
                             rtol=1e-6)
  np.testing.assert_allclose(g, (jnp.exp(logp) - jax.nn.one_hot(labels, V)) * V / math.sqrt(V - 1),
                             rtol=1e-5, atol=1e-6)


def _library_tau_rule(residual_mult, residual_attn_ratio):
  # unit-scaling v0.3.5, unit_scaling/core/functional.py, transformer_residual_scaling_rule,
  # transcribed line by line.
  alpha_mlp = residual_mult * (2 / (1 + residual_attn_ratio**2)) ** 0.5
  alpha_attn = residual_attn_ratio * alpha_mlp

  def _tau(index, layers):
    n_attn = (index + 1) // 2
    n_mlp = index // 2
    return (alpha_attn if (index % 2) == 0 else alpha_mlp) / (
        layers / 2 + n_attn * alpha_attn**2 + n_mlp * alpha_mlp**2) ** 0.5

  return _tau


@pytest.mark.parametrize("mult,ratio", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.25), (1.3, 0.7)])
@pytest.mark.parametrize("num_layers", [1, 4, 12])
def test_tau_rule_matches_library_source(mult, ratio, num_layers):
  ours, theirs = us.transformer_residual_scaling_rule(mult, ratio), _library_tau_rule(mult, ratio)
  n = 2 * num_layers
  np.testing.assert_allclose([ours(i, n) for i in range(n)], [theirs(i, n) for i in range(n)],
                             rtol=1e-14)


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


def test_unit_scaled_below_one_at_short_causal_prefixes():
  # The docstring's numbers: at mult = sqrt(d) (logit variance 1) the per-query
  # factor's variance model (1 + (n - 1) e)/n^2 overestimates sum_j p_j^2 for few
  # keys, so the output std dips to about 0.82 at n_i = 2..4 and recovers with n;
  # at n = 1 it is exactly unit, at mult = sqrt(d)/2 within 2%.
  d, T = 64, 8
  q, k, v = (normal(s, (256, T, 8, d)) for s in (0, 1, 2))
  std_T = lambda mult: jnp.std(attnscale.attention(
      q, k, v, scale_fn=scalings.get("umup", mult=mult), is_causal=True), axis=(0, 2, 3))
  low, half = std_T(8.0), std_T(4.0)
  np.testing.assert_allclose(low[0], 1.0, atol=0.02)  # n = 1: the value itself
  assert jnp.all((low[1:4] > 0.77) & (low[1:4] < 0.87)), low
  assert low[7] > low[2]  # recovering with n (0.86 at n = 8)
  np.testing.assert_allclose(half, 1.0, atol=0.04)
