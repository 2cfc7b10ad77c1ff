"""The unit-scaled, residual-weighted transformer: unit scale at init, trains."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import unit_scaling as us
from attnscale.model import ModelConfig
from attnscale.unit_model import UnitScaledTransformer, branch_taus
from configs import shakespeare_char


def make_model(**kw):
  cfg = dict(vocab_size=65, block_size=64, num_layers=2, num_heads=4, width=128,
             scaling="fully_scaled", variant="unit_scaled")
  return UnitScaledTransformer(ModelConfig(**(cfg | kw)), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("scaling", ["fully_scaled", "unit_scaled"])
@pytest.mark.parametrize("causal", [True, False])
def test_every_block_unit_at_init(scaling, causal):
  # Unit-scaling style: each block on random N(0, 1) input, a N(0, 1) cotangent.
  model = make_model(scaling=scaling, causal=causal)
  x = jax.random.normal(jax.random.key(1), (16, 64, 128))
  for l, block in enumerate(model.blocks):
    graphdef, params = nnx.split(block, nnx.Param)

    def run(params, x):
      b = nnx.merge(graphdef, params)
      return {"attn": b.attn(b.ln1(x)), "mlp": b.mlp(b.ln2(x)), "out": b(x)}

    acts, vjp = jax.vjp(run, params, x)
    for name, a in acts.items():
      assert abs(float(jnp.std(a)) - 1) < 0.1, (l, name, float(jnp.std(a)))
    cot = {k: jnp.zeros_like(a) for k, a in acts.items()}
    cot["out"] = jax.random.normal(jax.random.key(2), acts["out"].shape)
    grads, gx = vjp(cot)
    # The linear layers use unit scaling's "to_output_scale" constraint (their
    # backward is the true gradient of their forward), so a gradient is unit only
    # up to sqrt(fan_out / fan_in) (2 for the MLP's up-projection at mlp_ratio 4).
    assert 0.8 < float(jnp.std(gx)) < 1.6, (l, float(jnp.std(gx)))
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
      name, std = jax.tree_util.keystr(path), float(jnp.std(g))
      if "w_q" in name or "w_k" in name:
        # Known gap (issue #4 stays open): the softmax backward is not
        # unit-scaled, so q/k weight gradients are about 0.2 at init.
        assert 0.05 < std < 2.2, (l, name, std)
      elif g.ndim >= 2:
        assert 0.5 < std < 2.2, (l, name, std)


def test_embedding_and_logits_unit_at_init():
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (16, 64), 0, 65)
  assert abs(float(jnp.std(model.embed_tokens(tokens))) - 1) < 0.1
  # Not 0.1: real token streams are correlated across positions after attention.
  assert abs(float(jnp.std(model(tokens))) - 1) < 0.2


def test_branch_taus_follow_the_rules():
  cfg = ModelConfig(num_layers=3, width=64, num_heads=4, block_size=256,
                    scaling="fully_scaled", variant="unit_scaled")
  np.testing.assert_allclose(branch_taus(cfg), [1 / math.sqrt(3 + i) for i in range(6)])
  rel = ModelConfig(**{**cfg.__dict__, "attn_residual": "relative"})
  r = us.attention_residual_weight(256, is_causal=True)
  np.testing.assert_allclose(branch_taus(rel)[0::2], [r / math.sqrt(3 + i) for i in (0, 2, 4)])
  np.testing.assert_allclose(branch_taus(rel)[1::2], branch_taus(cfg)[1::2])


def test_relative_weight_matches_standard_attention_share():
  # Graphcore's fix: the unit-scale attention branch enters the stream at about
  # the share the standard model's under-scaled attention has: sqrt(e/n) of the skip.
  r = us.attention_residual_weight(256)
  assert r == pytest.approx(math.sqrt(math.e / 256))


def test_config_argument_reaches_the_variant():
  c = shakespeare_char.get_config("preset=test,scaling=unit_scaled")
  assert (c.model.variant, c.model.scaling, c.model.attn_residual) == (
      "unit_scaled", "fully_scaled", "relative")
  c = shakespeare_char.get_config("preset=test,scaling=fully_scaled")
  assert (c.model.variant, c.model.scaling) == ("standard", "fully_scaled")


def test_bad_variant_options():
  with pytest.raises(ValueError, match="model.variant must be one of"):
    ModelConfig(variant="unit")
  with pytest.raises(ValueError, match="model.variant='unit_scaled' takes a scaling"):
    ModelConfig(variant="unit_scaled", scaling="cosine")
  with pytest.raises(ValueError, match="model.residual_rule"):
    ModelConfig(variant="unit_scaled", residual_rule="2024")


def test_diagnostics_serve_the_unit_model():
  from attnscale import diagnostics
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, 65)
  stats = diagnostics.model_attention_stats(model, tokens)
  assert len(stats) == 2 and all(np.isfinite(v) for s in stats for v in s.values())


def test_causal_unit_model_never_sees_the_future():
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, 65)
  base = model(tokens)
  changed = model(tokens.at[:, 20:].set((tokens[:, 20:] + 1) % 65))
  np.testing.assert_array_equal(np.asarray(changed[:, :20]), np.asarray(base[:, :20]))
