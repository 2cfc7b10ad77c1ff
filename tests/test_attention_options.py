"""The model options of today's practice: logit soft-cap, sinks, output gates and
sigmoid, softpick, ReLU/L and stick-breaking attention, FoX, differential and
selective attention, exclusive self-attention and the per-head output RMSNorm, in
whole models: no future leak, no padding leak, reference ==
fused (values and gradients), learned parameters that learn, one-line errors.
(The kernel-level tests of the same options: tests/test_kernel_options.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import models
from attnscale.models import ModelConfig

V = 13
OPTIONS = {
    "softcap": dict(logit_softcap=2.0),  # tight enough to bind at init scales
    "sink_zero": dict(sink="zero"),
    "sink_learned": dict(sink="learned"),
    "gate_headwise": dict(attn_gate="headwise"),
    "gate_elementwise": dict(attn_gate="elementwise"),
    "sigmoid": dict(normalizer="sigmoid"),
    "softpick": dict(normalizer="softpick"),
    "relu": dict(normalizer="relu"),
    "stickbreaking": dict(normalizer="stickbreaking"),
    "forget_gate": dict(forget_gate=True),  # FoX
    "forget_gate_relu": dict(forget_gate=True, normalizer="relu"),
    "depth_complete_p": dict(depth_alpha=1.0, base_depth=1),  # branches x 1/2 (model-level)
    "differential": dict(differential=True),  # Ye et al.: one head of two maps
    "differential_fox_sink": dict(differential=True, forget_gate=True, sink="learned",
                                  logit_softcap=2.0, positions="rope"),
    "selective": dict(selective=True),  # Leviathan et al.: head 0 masks for later queries
    "selective_fox_sink": dict(selective=True, forget_gate=True, sink="learned",
                               logit_softcap=2.0),
    "all": dict(logit_softcap=2.0, sink="learned", attn_gate="headwise", positions="rope"),
    "xsa": dict(xsa=True),  # Zhai 2026: the own value's component removed
    "xsa_relu_gqa": dict(xsa=True, normalizer="relu", num_kv_heads=1),
    "head_norm": dict(head_norm="rmsnorm"),  # head-wise RMSNorm, arXiv 2605.06611
    "head_norm_xsa_gate": dict(head_norm="rmsnorm", xsa=True, attn_gate="elementwise",
                               sink="learned"),
}
SCALINGS = ("standard", "key_norm_sum", "cosine")  # a plain, a summing, a normalising scaling


def model(option, scaling="standard", **kw):
  cfg = ModelConfig(vocab_size=V, block_size=16, num_layers=2, num_heads=2, width=16,
                    scaling=scaling, **{**OPTIONS[option], **kw})
  m = models.build(cfg, rngs=nnx.Rngs(params=0))
  if cfg.sink == "learned":  # away from 0, so per-head values matter
    for block in m.blocks:
      block.attn.sink_logit[...] = jnp.array([0.7, -1.3])
  return m


CASES = [pytest.param(o, s, id=f"{o}-{s}") for o in OPTIONS for s in SCALINGS
         if not (o == "sigmoid" and s == "cosine")] + [
             pytest.param("sink_learned", "umup", id="sink_learned-unit", marks=()),
         ]


@pytest.mark.parametrize("option, scaling", CASES)
def test_no_future_leak(option, scaling):
  variant = "unit" if scaling == "umup" else "standard"
  m = model(option, scaling, variant=variant)
  tokens = np.random.default_rng(0).integers(0, V, (2, 16)).astype(np.int32)
  t = 6
  full = m(tokens)
  np.testing.assert_allclose(m(tokens[:, :t]), full[:, :t], rtol=1e-5, atol=1e-5)
  other = tokens.copy()
  other[:, t:] = (other[:, t:] + 1) % V
  np.testing.assert_array_equal(m(other)[:, :t], full[:, :t])

  def early(x_BTD):
    for block in m.blocks:
      x_BTD = block(x_BTD)
    return m.logits(x_BTD)[:, t - 1].sum()

  g_BTD = jax.grad(early)(m.embed_tokens(tokens))
  assert np.all(np.asarray(g_BTD[:, t:]) == 0)


# Stick-breaking and FoX are causal only (no order to break the stick in or to decay
# along): no encoder.
CAUSAL_ONLY = ("all", "stickbreaking", "forget_gate", "forget_gate_relu",
               "differential_fox_sink", "selective", "selective_fox_sink")


@pytest.mark.parametrize("option", [o for o in OPTIONS if o not in CAUSAL_ONLY])
def test_encoder_sees_no_padding(option):
  m = model(option, causal=False)
  tokens = np.random.default_rng(1).integers(0, V, (2, 16)).astype(np.int32)
  mask = (np.arange(16) < 10)[None, None, None, :]
  other = tokens.copy()
  other[:, 10:] = (other[:, 10:] + 5) % V
  np.testing.assert_array_equal(m(tokens, mask=mask)[:, :10], m(other, mask=mask)[:, :10])


@pytest.mark.parametrize("option, scaling", CASES[:len(CASES) - 1])
def test_reference_equals_fused(option, scaling):
  fused, reference = model(option, scaling), model(option, scaling, attention_impl="reference")
  tokens = np.random.default_rng(2).integers(0, V, (2, 16)).astype(np.int32)
  np.testing.assert_allclose(fused(tokens), reference(tokens), rtol=1e-4, atol=1e-5)
  loss = lambda m: jnp.mean(m(tokens) ** 2)
  for a, b in zip(jax.tree.leaves(nnx.grad(loss)(fused)),
                  jax.tree.leaves(nnx.grad(loss)(reference))):
    np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-6)


def test_options_change_the_model_and_learned_parameters_get_gradients():
  tokens = np.random.default_rng(3).integers(0, V, (2, 16)).astype(np.int32)
  # Large weights, so that the cap binds (init logits are far below 2 otherwise).
  base = model("softcap", logit_softcap=0.0, init_std=0.5)(tokens)
  for option in OPTIONS:
    assert not np.allclose(model(option, init_std=0.5)(tokens), base), option
  m = model("all")
  grads = nnx.grad(lambda m: jnp.mean(m(tokens) ** 2))(m)
  for i in range(2):
    attn = grads["blocks"][i]["attn"]
    assert np.all(np.asarray(jax.tree.leaves(attn["sink_logit"])[0]) != 0)
    assert np.any(np.asarray(jax.tree.leaves(attn["gate_proj"])[0]) != 0)
  grads = nnx.grad(lambda m: jnp.mean(m(tokens) ** 2))(model("forget_gate"))
  for i in range(2):  # FoX's projection and bias both learn
    assert all(np.any(np.asarray(g) != 0)
               for g in jax.tree.leaves(grads["blocks"][i]["attn"]["forget_proj"]))


def test_softcap_bounds_the_logits_the_diagnostics_see():
  from attnscale.evaluation import diagnostics
  m = model("softcap", scaling="none")  # unscaled logits: large enough to be capped
  tokens = np.random.default_rng(4).integers(0, V, (2, 16)).astype(np.int32)
  for layer in diagnostics.model_attention_stats(m, jnp.asarray(tokens)):
    assert layer["max_logit"] <= 2.0
  sink = diagnostics.model_attention_stats(model("sink_zero"), jnp.asarray(tokens))
  plain = diagnostics.model_attention_stats(model("softcap", logit_softcap=0.0),
                                            jnp.asarray(tokens))
  # The off-by-one softmax gives the sink some weight: less on the first key.
  assert sink[0]["sink_rate"] < plain[0]["sink_rate"]


def test_one_line_errors():
  bad = {"logit_softcap": (-1.0, r"model.logit_softcap must be >= 0"),
         "sink": ("first", r"model.sink must be one of \['none', 'zero', 'learned'\]"),
         "attn_gate": ("tanh", r"model.attn_gate must be one of \['none', 'headwise', "
                               r"'elementwise'\]")}
  for field, (value, message) in bad.items():
    with pytest.raises(ValueError, match=message):
      ModelConfig(**{field: value})
  with pytest.raises(ValueError, match="model.sink='zero' needs model.normalizer='softmax'"):
    ModelConfig(sink="zero", normalizer="sigmoid")
  with pytest.raises(ValueError, match="model.attn_gate='headwise' is not available in "
                                       "model.variant='unit'"):
    ModelConfig(variant="unit", scaling="fully_scaled", attn_gate="headwise")
  with pytest.raises(ValueError, match="model.forget_gate=True needs model.causal=True"):
    ModelConfig(forget_gate=True, causal=False)
  with pytest.raises(ValueError, match="model.normalizer='stickbreaking' needs "
                                       "model.causal=True"):
    ModelConfig(normalizer="stickbreaking", causal=False)
  with pytest.raises(ValueError, match="model.forget_gate=True is not available in "
                                       "model.variant='unit'"):
    ModelConfig(variant="unit", scaling="fully_scaled", forget_gate=True)


def test_the_forget_gate_decays_attention_with_distance():
  """FoX with the gate's bias pushed far negative (f about 0): every query attends to
  itself alone, so the logits equal those of a model whose attention is the identity."""
  m = model("forget_gate")
  for block in m.blocks:
    block.attn.forget_proj.bias[...] = jnp.full((2,), -30.0)
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, V, (2, 16)).astype(np.int32))
  call = m.blocks[0].attention_call(m.embed_tokens(tokens))
  from attnscale.core.attention import attention_weights
  _, probs_BNTS = attention_weights(call.q_BTNH, call.k_BSKH, mask=None, **call.options())
  np.testing.assert_allclose(np.asarray(probs_BNTS), np.broadcast_to(np.eye(16), probs_BNTS.shape),
                             atol=1e-6)


def test_xsa_output_is_orthogonal_to_the_own_value_and_head_norm_has_unit_rms():
  """XSA (z_i . v_i = 0 per head, grouped-query heads reading their value head) and
  the head-wise RMSNorm (RMS 1 per head at gain 1), against their formulas."""
  from attnscale.core import head_outputs
  rng = np.random.default_rng(6)
  y = jnp.asarray(rng.normal(size=(2, 5, 4, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(2, 5, 2, 8)), jnp.float32)
  z = head_outputs.exclusive(y, v)
  v_rep = np.repeat(np.asarray(v), 2, axis=2)
  np.testing.assert_allclose(np.sum(np.asarray(z) * v_rep, -1), 0, atol=1e-5)
  want = np.asarray(y) - (np.sum(np.asarray(y) * v_rep, -1, keepdims=True)
                          / np.sum(v_rep**2, -1, keepdims=True)) * v_rep
  np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-6)
  assert np.all(np.isfinite(head_outputs.exclusive(y, jnp.zeros_like(v))))
  n = head_outputs.head_rms_norm(y, jnp.ones((4, 8)))
  np.testing.assert_allclose(np.sqrt(np.mean(np.asarray(n) ** 2, -1)), 1, rtol=1e-4)
  grads = nnx.grad(lambda m: jnp.mean(m(jnp.zeros((2, 16), jnp.int32) + 3) ** 2))(
      model("head_norm"))
  assert np.any(np.asarray(jax.tree.leaves(grads["blocks"][0]["attn"]["head_norm_gain"])[0])
                != 0)
  with pytest.raises(ValueError, match=r"model.head_norm must be one of \['none', 'rmsnorm'\]"):
    ModelConfig(head_norm="layernorm")
  with pytest.raises(ValueError, match="model.differential=True cannot take model.xsa"):
    ModelConfig(differential=True, xsa=True)
  with pytest.raises(ValueError, match="model.head_norm='rmsnorm' is not available in "
                                       "model.variant='unit'"):
    ModelConfig(variant="unit", scaling="fully_scaled", head_norm="rmsnorm")
