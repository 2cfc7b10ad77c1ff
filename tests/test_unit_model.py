"""The unit-scaled, residual-weighted transformer: unit scale at init, trains."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attnscale.models import ModelConfig, UnitConfig
from attnscale.models import unit_transformer as unit_model
from attnscale.models.unit_transformer import UnitScaledTransformer, branch_taus
from attnscale.numerics import unit_scaling as us
from configs import shakespeare_char

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")


def unit_config(**kw) -> ModelConfig:
  """A ModelConfig of the unit variant; the `UnitConfig` fields may be given flat."""
  fields = {f.name for f in dataclasses.fields(UnitConfig)}
  unit = UnitConfig(**{k: kw.pop(k) for k in list(kw) if k in fields})
  return ModelConfig(**({"variant": "unit"} | kw), unit=unit)


def make_model(**kw):
  cfg = dict(vocab_size=65, block_size=64, num_layers=2, num_heads=4, width=128,
             scaling="fully_scaled")
  return UnitScaledTransformer(unit_config(**(cfg | kw)), rngs=nnx.Rngs(0))


def block_vjp(block, x, cotangent):
  """Activations of one block's parts and the gradients of its output."""
  graphdef, params = nnx.split(block, nnx.Param)

  def run(params, x):
    b = nnx.merge(graphdef, params)
    return {"attn": b.attn(b.ln1(x)), "mlp": b.mlp(b.ln2(x)), "out": b(x)}

  acts, vjp = jax.vjp(run, params, x)
  cot = {k: jnp.zeros_like(a) for k, a in acts.items()} | {"out": cotangent}
  grads, gx = vjp(cot)
  return acts, grads, gx


# The experiment's configuration (scaling=unit_scaled in the config argument)
# and u-muP's own 1/d attention.
EXPERIMENT = dict(scaling="fully_scaled", attn_residual="relative")
UMUP = dict(scaling="umup")


@pytest.mark.parametrize("kw", [EXPERIMENT, UMUP], ids=["fully_scaled", "umup"])
@pytest.mark.parametrize("causal", [True, False])
def test_every_block_unit_at_init(kw, causal):
  # Unit-scaling style: each block on random N(0, 1) input, a N(0, 1) cotangent.
  model = make_model(causal=causal, **kw)
  x = jax.random.normal(jax.random.key(1), (16, 64, 128))
  for l, block in enumerate(model.blocks):
    g = jax.random.normal(jax.random.key(2 + l), x.shape)
    acts, grads, gx = block_vjp(block, x, g)
    for name, a in acts.items():
      assert abs(float(jnp.std(a)) - 1) < 0.1, (l, name, float(jnp.std(a)))
    assert abs(float(jnp.std(gx)) - 1) < 0.1, (l, "grad x", float(jnp.std(gx)))
    for path, w in jax.tree_util.tree_leaves_with_path(grads):
      name, std = jax.tree_util.keystr(path), float(jnp.std(w))
      if "w_q" in name or "w_k" in name:
        # dq's std is estimated as s sqrt(d) (`qk_grad_std`); the softmax's
        # mean subtraction and few-key causal rows leave it 0.8 - 1.25.
        assert 0.75 < std < 1.25, (l, name, std)
      elif "scale" in name:
        # A LayerNorm gain's gradient sums y * g over the batch: only D = 128
        # numbers, and the q/k paths correlate y with g, which adds a mean.
        assert abs(std - 1) < 0.25, (l, name, std)
      else:
        assert abs(std - 1) < 0.1, (l, name, std)


def test_mlp_internal_gradients_unit():
  # Every tensor inside the MLP branch gets a unit gradient, not only the weights.
  mlp = make_model().blocks[0].mlp
  x = jax.random.normal(jax.random.key(1), (16, 64, 128))
  y, vjp_x = jax.vjp(mlp, x)
  g = jax.random.normal(jax.random.key(2), y.shape)
  assert abs(float(jnp.std(y)) - 1) < 0.1
  # The input's gradient is the true one: the GELU's rms / grad-rms mismatch.
  assert float(jnp.std(vjp_x(g)[0])) == pytest.approx(1 / mlp.entry_grad_scale, rel=0.05)
  # Inside: the gradients of the GELU's output and input (the up-projection's output).
  u = us.linear(x, mlp.w_up[...], constraint=None)
  down = lambda h: us.linear(h, mlp.w_down[...], constraint=None)
  h = us.scale_fwd(us.gelu(u, constraint=None), unit_model._GELU_STD_OVER_RMS)
  _, vjp_h = jax.vjp(down, h)
  _, vjp_u = jax.vjp(lambda u: down(us.scale_fwd(us.gelu(u, constraint=None),
                                                 unit_model._GELU_STD_OVER_RMS)), u)
  assert abs(float(jnp.std(vjp_h(g)[0])) - 1) < 0.1
  assert abs(float(jnp.std(vjp_u(g)[0])) - 1) < 0.1


@pytest.mark.parametrize("kw", [EXPERIMENT, UMUP, dict(UMUP, shared_kv=True),
                                dict(EXPERIMENT, residual_rule="2023")],
                         ids=["fully_scaled", "umup", "shared_kv", "rule_2023"])
def test_gradients_are_valid(kw, monkeypatch):
  """dL/dx is exactly plain autodiff; each weight gradient a positive multiple of it.

  Plain autodiff: the same forward with scale_fwd(x, s) = x * s and scale_bwd
  the identity. Unit scaling may rescale a weight's gradient (a cut edge), never
  change its direction or the stream's gradient.
  """
  model = make_model(**kw)
  x = jax.random.normal(jax.random.key(1), (4, 64, 128))
  g = jax.random.normal(jax.random.key(2), x.shape)
  _, grads, gx = block_vjp(model.blocks[1], x, g)
  monkeypatch.setattr(us, "scale_fwd", lambda x, s: x * s)
  monkeypatch.setattr(us, "scale_bwd", lambda x, s: x)
  _, plain, gx_plain = block_vjp(model.blocks[1], x, g)
  np.testing.assert_allclose(gx, gx_plain, rtol=1e-4, atol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(plain)):
    a, b = np.ravel(a), np.ravel(b)
    ratio = np.dot(a, b) / np.dot(b, b)
    assert ratio > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(a, ratio * b, rtol=1e-3, atol=1e-6 * np.abs(a).max(),
                               err_msg=jax.tree_util.keystr(path))


def test_embedding_and_logits_unit_at_init():
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (16, 64), 0, 65)
  assert abs(float(jnp.std(model.embed_tokens(tokens))) - 1) < 0.1
  # Not 0.1: real token streams are correlated across positions after attention.
  assert abs(float(jnp.std(model(tokens))) - 1) < 0.2


def test_scaled_loss_is_a_constant_factor_on_every_gradient():
  """model.unit.scaled_loss multiplies every parameter gradient by exactly
  `loss_grad_scale` = N V / sqrt(V - 1), which brings the loss's gradient at
  the logits to unit RMS at init (it is about 2^-13 without)."""
  tokens = jax.random.randint(jax.random.key(1), (16, 64), 0, 65)
  targets = jnp.roll(tokens, -1, axis=1)

  def param_grads(model):
    graphdef, params = nnx.split(model, nnx.Param)
    loss = lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        nnx.merge(graphdef, p)(tokens), targets))
    return jax.grad(loss)(params), model.loss_grad_scale(tokens.size)

  scaled, s = param_grads(make_model())
  plain, one = param_grads(make_model(scaled_loss=False))
  assert one == 1.0 and s == pytest.approx(tokens.size * 65 / 8)
  for a, b in zip(jax.tree.leaves(scaled), jax.tree.leaves(plain)):
    np.testing.assert_allclose(np.asarray(a) / s, b, rtol=2e-4, atol=1e-6 * np.abs(b).max())
  # The cotangent the readout receives: (p - onehot(y)) / N, times s.
  g = (jax.nn.softmax(make_model()(tokens)) - jax.nn.one_hot(targets, 65)) * s / tokens.size
  assert abs(float(jnp.sqrt(jnp.mean(g**2))) - 1) < 0.2


def test_train_step_hands_the_optimizer_the_true_gradient():
  """One float32 train step gives the same update with model.unit.scaled_loss on
  or off: the step divides the scale back (with clipping on, which would show it)."""
  from attnscale import tasks
  from attnscale.runtime import steps
  from attnscale.runtime import train_state as ts

  results = []
  for scaled in (True, False):
    config = shakespeare_char.get_config("preset=test,scaling=unit_scaled")
    config.model.unit.scaled_loss = scaled
    config.grad_clip = 1e-3
    task, mesh = tasks.get_task(config), ts.make_mesh(config)
    graphdef, state, shardings = ts.create_state(config, mesh)
    step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
    batch = steps.global_batch(task.train_batch(0), ts.batch_sharding(mesh))
    state, metrics = step(state, batch)
    results.append((jax.tree.leaves(state["params"]), float(metrics["grad_norm"])))
  (a, norm_a), (b, norm_b) = results
  assert norm_a == pytest.approx(norm_b, rel=1e-4)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_branch_taus_follow_the_rules():
  cfg = unit_config(num_layers=3, width=64, num_heads=4, block_size=256,
                    scaling="fully_scaled")
  np.testing.assert_allclose(branch_taus(cfg), [1 / math.sqrt(3 + i) for i in range(6)])
  rel = dataclasses.replace(cfg, unit=UnitConfig(attn_residual="relative"))
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
  assert (c.model.variant, c.model.scaling, c.model.unit.attn_residual) == (
      "unit", "fully_scaled", "relative")
  c = shakespeare_char.get_config("preset=test,scaling=fully_scaled")
  assert (c.model.variant, c.model.scaling) == ("standard", "fully_scaled")


def test_bad_variant_options():
  with pytest.raises(ValueError, match="model.variant must be one of"):
    ModelConfig(variant="units")
  with pytest.raises(ValueError, match="model.variant='unit' takes a scaling"):
    ModelConfig(variant="unit", scaling="cosine")
  with pytest.raises(ValueError, match="model.unit.residual_rule"):
    unit_config(residual_rule="2024")
  # The old names say what replaced them.
  with pytest.raises(ValueError, match="model.variant='unit_scaled' was renamed 'unit'"):
    ModelConfig(variant="unit_scaled")
  with pytest.raises(ValueError, match="scaling 'unit_scaled' was renamed 'umup'"):
    ModelConfig(scaling="unit_scaled")


def test_diagnostics_serve_the_unit_model():
  from attnscale.evaluation import diagnostics
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, 65)
  stats = diagnostics.model_attention_stats(model, tokens)
  assert len(stats) == 2 and all(np.isfinite(v) for s in stats for k, v in s.items()
                                 if k != "heads")
  assert all(np.isfinite(s["heads"]["sink_rate"]).all() for s in stats)


def test_causal_unit_model_never_sees_the_future():
  model = make_model()
  tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, 65)
  base = model(tokens)
  changed = model(tokens.at[:, 20:].set((tokens[:, 20:] + 1) % 65))
  np.testing.assert_array_equal(np.asarray(changed[:, :20]), np.asarray(base[:, :20]))
