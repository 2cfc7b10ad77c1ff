"""Positions (learned, rope, none): rotary's relative property, causality with
every scaling, reference == fused, and the one-line errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import models
from attnscale.core import positions
from attnscale.models import ModelConfig
from attnscale.testing import SCALING_CASES

POSITIONS = ("learned", "rope", "none")
V = 13


def lm(name="standard", params=None, positions_="rope", variant="standard", **kw):
  cfg = ModelConfig(vocab_size=V, block_size=16, num_layers=2, num_heads=2, width=16,
                    scaling=name, scaling_params=params, positions=positions_,
                    variant=variant, **kw)
  return models.build(cfg, rngs=nnx.Rngs(params=0))


def test_rope_logits_depend_on_offsets_only():
  q = jax.random.normal(jax.random.key(0), (1, 10, 2, 8))
  k = jax.random.normal(jax.random.key(1), (1, 10, 2, 8))
  pos = jnp.arange(10)

  def logits(offset):
    qr, kr = positions.rope(q, pos + offset), positions.rope(k, pos + offset)
    return jnp.einsum("btnh,bsnh->bnts", qr, kr)

  np.testing.assert_allclose(logits(0), logits(37), atol=2e-5)
  np.testing.assert_allclose(logits(0), logits(1000), atol=2e-4)
  # ... and rotation keeps norms, so norm-based scalings see the same norms.
  np.testing.assert_allclose(jnp.linalg.norm(positions.rope(q, pos), axis=-1),
                             jnp.linalg.norm(q, axis=-1), rtol=1e-5)
  # Position 0 is the identity.
  np.testing.assert_allclose(positions.rope(q, jnp.zeros(10, jnp.int32)), q)


def test_rope_matches_the_complex_form():
  """RoFormer's definition: pair m as a complex number times exp(i t theta_m)."""
  x = np.random.default_rng(0).normal(size=(1, 5, 1, 6)).astype(np.float32)
  t = np.arange(5)
  theta = 10000.0 ** (-np.arange(0, 6, 2) / 6)
  z = (x[..., :3] + 1j * x[..., 3:]) * np.exp(1j * t[None, :, None, None] * theta)
  expected = np.concatenate([z.real, z.imag], -1)
  np.testing.assert_allclose(positions.rope(jnp.asarray(x), jnp.asarray(t)), expected,
                             atol=1e-5)


CAUSAL_CASES = ([pytest.param(name, params, pos, "standard", id=f"{i}-{pos}")
                 for i, name, params in SCALING_CASES if i != "log_n_per_head"
                 for pos in POSITIONS]
                + [pytest.param(name, {}, pos, "unit", id=f"unit-{name}-{pos}")
                   for name in ("fully_scaled", "umup") for pos in POSITIONS])


@pytest.mark.parametrize("name, params, pos, variant", CAUSAL_CASES)
def test_no_future_leak(name, params, pos, variant):
  """A prefix's logits equal the full sequence's there; later tokens change nothing
  earlier, and the gradient of an early output w.r.t. later inputs is exactly 0."""
  model = lm(name, params, pos, variant)
  T, t = 16, 7
  tokens = np.random.default_rng(0).integers(0, V, (2, T)).astype(np.int32)
  full = model(tokens)
  np.testing.assert_allclose(model(tokens[:, :t]), full[:, :t], rtol=1e-5, atol=1e-5)
  other = tokens.copy()
  other[:, t:] = (other[:, t:] + 1) % V
  np.testing.assert_array_equal(model(other)[:, :t], full[:, :t])

  x_BTD = model.embed_tokens(tokens)

  def early_output(x_BTD):
    for block in model.blocks:
      x_BTD = block(x_BTD)
    return model.logits(x_BTD)[:, t - 1].sum()

  grad_BTD = jax.grad(early_output)(x_BTD)
  assert np.all(np.asarray(grad_BTD[:, t:]) == 0)
  assert np.any(np.asarray(grad_BTD[:, :t]) != 0)


@pytest.mark.parametrize("name, params", [pytest.param(n, p, id=i)
                                          for i, n, p in SCALING_CASES
                                          if i != "log_n_per_head"])
@pytest.mark.parametrize("pos", ("rope", "none"))
def test_reference_equals_fused_past_training_length(name, params, pos):
  """At 3x block_size (only rope and none can): the two paths agree, with gradients."""
  fused = lm(name, params, pos)
  reference = lm(name, params, pos, attention_impl="reference")
  tokens = np.random.default_rng(1).integers(0, V, (2, 48)).astype(np.int32)
  np.testing.assert_allclose(fused(tokens), reference(tokens), rtol=2e-4, atol=2e-4)

  def loss(model):
    return jnp.mean(model(tokens) ** 2)

  g_fused = jax.tree.leaves(nnx.grad(loss)(fused))
  g_reference = jax.tree.leaves(nnx.grad(loss)(reference))
  for a, b in zip(g_fused, g_reference):
    np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-5)


def test_encoder_with_rope_sees_no_padding():
  model = lm("standard", None, "rope", causal=False)
  tokens = np.random.default_rng(0).integers(0, V, (2, 16)).astype(np.int32)
  mask = (np.arange(16) < 9)[None, None, None, :]
  other = tokens.copy()
  other[:, 9:] = (other[:, 9:] + 3) % V
  np.testing.assert_array_equal(model(tokens, mask=mask)[:, :9], model(other, mask=mask)[:, :9])


def test_one_line_errors():
  with pytest.raises(ValueError, match=r"model.positions must be one of \['learned', 'rope', "
                     r"'none'\], got 'alibi'"):
    lm(positions_="alibi")
  with pytest.raises(ValueError, match="bidirectional encoder cannot infer positions"):
    lm(positions_="none", causal=False)
  with pytest.raises(ValueError, match="even head dim"):
    ModelConfig(width=18, num_heads=2, positions="rope")
  model = lm(positions_="learned")
  with pytest.raises(ValueError, match="exceeds model.block_size 16.*'rope' or 'none'"):
    model(np.zeros((1, 17), np.int32))
  # rope and none have no position table: longer than training is fine.
  assert lm(positions_="rope")(np.zeros((1, 40), np.int32)).shape == (1, 40, V)
  assert lm(positions_="none")(np.zeros((1, 40), np.int32)).shape == (1, 40, V)


def test_learned_positions_init_unchanged_and_only_there():
  learned, rope = lm(positions_="learned"), lm(positions_="rope")
  assert learned.pos_embed is not None and rope.pos_embed is None
  # Rotary adds no parameters: the rope model's are the learned one's minus the table.
  n = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  assert n(learned) - n(rope) == 16 * 16


def _all_shapes(jaxpr):
  """Every intermediate's shape, inside nested jaxprs (jit, custom_vjp, ...) too."""
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      yield getattr(v.aval, "shape", ())
    for sub in _sub_jaxprs(eqn.params):
      yield from _all_shapes(sub)


def _sub_jaxprs(params):
  for value in params.values():
    for v in value if isinstance(value, (list, tuple)) else (value,):
      if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        yield v.jaxpr
      elif hasattr(v, "eqns"):
        yield v


@pytest.mark.parametrize("name", ["standard", "log_n", "key_norm_sum", "fully_scaled"])
def test_long_evaluation_builds_no_t_by_t_array(name):
  """At 16x a training length of 32, no value in the forward pass is L x L: the
  fused kernel's causal blocks hold [rows, L] logits with rows < L."""
  model = lm(name, None, "rope")
  L = 512
  graphdef, state = nnx.split(model)
  fwd = lambda state, tokens: nnx.merge(graphdef, state)(tokens)
  jaxpr = jax.make_jaxpr(fwd)(state, jnp.zeros((1, L), jnp.int32)).jaxpr
  square = [s for s in _all_shapes(jaxpr) if sum(d == L for d in s) >= 2]
  assert not square, square[:3]
