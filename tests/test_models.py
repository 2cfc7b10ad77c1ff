"""The model seams: the variant registry, the declared contract, scalings that own
their parameters, and the renamed names' errors."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnscale
from attnscale import models
from attnscale.config import labels, migration, schema
from attnscale.core import scalings
from attnscale.core.scalings import Learned, Scaled
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import train_lib
from attnscale.runtime import train_state as ts
from configs import shakespeare_char

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")


# A scaling with a learned per-head parameter, defined here only: nothing under
# attnscale/ names it.
@dataclasses.dataclass(frozen=True)
class HeadTemperature:
  """logits = exp(t_n) q.k / sqrt(d), t_n learned per head (a test's own scaling)."""

  log_t: object = 0.0  # [N] when learned; the default serves analysis code

  def __call__(self, q_BTNH, k_BSKH, keys):
    t_N = jnp.exp(jnp.asarray(self.log_t, jnp.float32))
    s_BTN = jnp.broadcast_to(t_N * q_BTNH.shape[-1] ** -0.5, keys.count().shape)
    return Scaled(q_BTNH, k_BSKH, logit_scale=s_BTN)


@pytest.fixture(autouse=True)
def head_temperature():
  """Registers the test's scaling for one test (the registry is global: other
  modules check that every registered scaling is tested and documented)."""
  scalings.register("test_head_temperature",
                    learned={"log_t": Learned(("heads",), init=0.0)})(HeadTemperature)
  yield
  scalings._REGISTRY.pop("test_head_temperature")


def tiny(**kw) -> models.ModelConfig:
  return models.ModelConfig(**(dict(vocab_size=11, block_size=16, num_layers=2, num_heads=2,
                                    width=16) | kw))


@pytest.mark.slow
def test_learned_scaling_from_outside_trains_end_to_end(tmp_path, tfds_dir):
  config = shakespeare_char.get_config("preset=test")
  config.data_dir = tfds_dir
  config.model.scaling = "test_head_temperature"
  config.num_train_steps = 12
  train_lib.train_and_evaluate(config, str(tmp_path))

  # Every layer got its own per-head parameter, and training moved it.
  graphdef, state, shardings = ts.create_state(config, ts.make_mesh())
  init = nnx.merge(graphdef, state["params"])
  checkpoints = ckpt.Checkpoints(str(tmp_path), config.keep_checkpoints)
  trained = nnx.merge(graphdef, checkpoints.restore(state, shardings)["params"])
  checkpoints.close()
  for before, after in zip(init.blocks, trained.blocks):
    assert before.attn.scaling.log_t.shape == (config.model.num_heads,)
    np.testing.assert_array_equal(before.attn.scaling.log_t[...], 0.0)
    assert np.all(np.abs(after.attn.scaling.log_t[...]) > 0)

  # And the gradient reaches it directly.
  tokens = jnp.asarray(np.arange(2 * 32).reshape(2, 32) % 65)
  grads = nnx.grad(lambda m: jnp.mean(m(tokens) ** 2))(init)
  assert np.all(np.abs(grads.blocks[0].attn.scaling.log_t[...]) > 0)


def test_learned_parameters_follow_the_registration():
  # cosine: one temperature per layer at g0 = log2(L^2 - L); qk_layernorm: gains [H].
  cos = models.build(tiny(scaling="cosine"), rngs=nnx.Rngs(0))
  g0 = scalings.cosine_temperature_init(16)
  assert [float(b.attn.scaling.temperature[...]) for b in cos.blocks] == pytest.approx([g0] * 2)
  ln = models.build(tiny(scaling="qk_layernorm"), rngs=nnx.Rngs(0))
  assert ln.blocks[0].attn.scaling.q_scale.shape == (8,)
  # A value in scaling_params fixes the parameter: none is created.
  fixed = models.build(tiny(scaling="cosine", scaling_params={"temperature": 10.0}),
                       rngs=nnx.Rngs(0))
  assert not hasattr(fixed.blocks[0].attn.scaling, "temperature")
  assert float(fixed.blocks[0].attn.scale_fn().temperature) == 10.0


@pytest.mark.parametrize("variant, scaling", [("standard", "standard"),
                                              ("standard", "cosine"),
                                              ("unit", "fully_scaled"),
                                              ("unit", "test_head_temperature")])
def test_every_variant_keeps_the_contract(variant, scaling):
  cfg = tiny(variant=variant, scaling=scaling)
  model = models.build(cfg, rngs=nnx.Rngs(0))
  assert isinstance(model, models.Model) and isinstance(model, models.VARIANTS[variant])
  tokens_BT = jax.random.randint(jax.random.key(1), (2, 10), 0, 11)
  logits_BTV = model(tokens_BT)
  assert logits_BTV.shape == (2, 10, 11) and logits_BTV.dtype == jnp.float32
  calls = model.attention_calls(tokens_BT)
  assert len(calls) == cfg.num_layers
  # The declared inputs are what the model attends with: recomputing layer 0's
  # output from them matches the block's own attention.
  x_BTD = model.embed_tokens(tokens_BT)
  block = model.blocks[0]
  c = calls[0]
  out = attnscale.attention(c.q_BTNH, c.k_BSKH, c.v_BSKH, scale_fn=c.scale_fn,
                            is_causal=c.is_causal, normalizer=c.normalizer)
  np.testing.assert_allclose(block.attn.project_out(out.reshape(2, 10, 16)),
                             block.attn(block.attn_input(x_BTD)), rtol=1e-5, atol=1e-6)


def test_renamed_names_say_what_replaced_them():
  with pytest.raises(ValueError, match="scaling 'unit_scaled' was renamed 'umup'"):
    scalings.get("unit_scaled")
  with pytest.raises(ValueError, match="model.variant='unit_scaled' was renamed 'unit'"):
    tiny(variant="unit_scaled")
  assert schema.RENAMED_FIELDS["model.residual_mult"] == "model.unit.residual_mult"


def test_old_saved_configs_migrate():
  config = shakespeare_char.get_config("preset=test,scaling=unit_scaled")
  old = json.loads(config.to_json())
  unit = old["model"].pop("unit")
  del unit["scaled_loss"]  # added after the move: migrate fills in ModelConfig's default
  old["model"].update(unit, variant="unit_scaled")  # the flat layout saved before
  assert migration.migrate(old) == json.loads(config.to_json())


def test_one_label_per_run():
  label = lambda arg: labels.run_label(shakespeare_char.get_config(f"preset=test,{arg}"))
  assert label("scaling=unit_scaled") == "unit_scaled"  # not "fully_scaled"
  assert label("scaling=fully_scaled") == "fully_scaled"
  config = shakespeare_char.get_config("preset=test,scaling=standard")
  config.model.qk_norm = "layernorm"  # the label of model.qk_layernorm=True before the rename
  assert labels.run_label(config) == "standard+qk_layernorm"
  config.model.qk_norm = "rmsnorm"
  assert labels.run_label(config) == "standard+qk_rmsnorm"
  config = shakespeare_char.get_config("preset=test,scaling=unit_scaled")
  config.model.scaling = "umup"
  assert labels.run_label(config) == "unit/umup"
  assert label("scaling=key_norm_power,p=3") == "key_norm_power(p=3)"
  config = shakespeare_char.get_config("preset=test,scaling=cosine")
  config.model.scaling_params = {"temperature": 10.0}
  config.model.logit_softcap, config.model.sink, config.model.attn_gate = 50.0, "zero", "headwise"
  assert labels.run_label(config) == "cosine(temperature=10)+softcap50+sink_zero+gate_headwise"


def test_a_new_variant_is_one_class_and_one_registry_line(monkeypatch):
  # A toy variant: a subclass and a registry entry are all the harness needs.
  from attnscale.models import transformer

  class AttentionOnly(transformer.Transformer):
    """The standard model with its MLPs removed (a toy for this test)."""

    def __init__(self, cfg, *, rngs):
      super().__init__(cfg, rngs=rngs)
      for block in self.blocks:
        block.mlp = lambda x: jnp.zeros_like(x)

  monkeypatch.setitem(models.VARIANTS, "attention_only", AttentionOnly)
  model = models.build(tiny(variant="attention_only"), rngs=nnx.Rngs(0))
  assert model(jnp.zeros((1, 4), jnp.int32)).shape == (1, 4, 11)
  assert re.search("attention_only", str(list(models.VARIANTS)))


def test_threefry_kernel_on_gpu_is_scoped_and_restored():
  """The init's compile-time switch (train_state.threefry_kernel_on_gpu) holds
  only inside its block, and is restored when the block raises."""
  assert not jax.config.jax_threefry_gpu_kernel_lowering
  with ts.threefry_kernel_on_gpu():
    assert jax.config.jax_threefry_gpu_kernel_lowering
  with pytest.raises(RuntimeError), ts.threefry_kernel_on_gpu():
    raise RuntimeError
  assert not jax.config.jax_threefry_gpu_kernel_lowering


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the kernel lowering is GPU-only")
def test_threefry_kernel_gives_the_same_initial_state_on_gpu():
  """create_state compiles its init with threefry's CUDA kernel (197 s -> 4 s at
  GPT-2 small on an H200); the parameters it draws are the fused lowering's, bit
  for bit."""
  config = shakespeare_char.get_config("preset=test")
  init = ts.init_fn(config)
  fused = jax.device_get(jax.jit(init)())
  with ts.threefry_kernel_on_gpu():
    kernel = jax.device_get(jax.jit(init)())
  for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(kernel), strict=True):
    np.testing.assert_array_equal(a, b)
