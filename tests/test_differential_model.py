"""Differential attention as a model (`model.differential`; Ye et al. 2025, arXiv
2410.05258): the layer against the paper's formulas written out in numpy, lambda's
init and reparameterisation, the standard model's parameter count, the attention
call the diagnostics read, values wider than q and k on every kernel, the config's
refusals, run label and packing, and a tiny train.py run with eval.py's diagnostics.
(No future or padding leak, prefix == full and reference == fused in whole models:
tests/test_attention_options.py, which takes it with the other options.)"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnscale
from attnscale import models, testing
from attnscale.config import labels
from attnscale.core import differential, fused, scalings, xla_attention
from attnscale.evaluation import diagnostics
from attnscale.runtime import packing
from attnscale.testing import padding_mask, random_qkv
from configs import shakespeare_char

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

V = 13


def tiny(**kw) -> models.ModelConfig:
  return models.ModelConfig(**(dict(vocab_size=V, block_size=16, num_layers=2, num_heads=4,
                                    width=32, differential=True) | kw))


def build(cfg, seed=0):
  return models.build(cfg, rngs=nnx.Rngs(params=seed))


def test_lambda_init_by_layer():
  # The paper's 1-based l; the reference code's lambda_init_fn(depth) with depth = l - 1.
  for layer in (1, 2, 5, 12):
    assert differential.lambda_init(layer) == pytest.approx(
        0.8 - 0.6 * math.exp(-0.3 * (layer - 1)))
  assert differential.lambda_init(1) == pytest.approx(0.2)
  m = build(tiny(num_layers=3))
  assert [b.attn.differential.lambda_init for b in m.blocks] == pytest.approx(
      [differential.lambda_init(l) for l in (1, 2, 3)])
  with pytest.raises(ValueError, match="lambda_init's layer is 1-based"):
    differential.lambda_init(0)


def test_lambda_reparameterisation_and_init():
  # Wide heads, so the N(0, 0.1) init's std is measured on 4 x 128 draws.
  heads = build(tiny(width=256, num_heads=2, num_layers=1)).blocks[0].attn.differential
  vecs = [np.asarray(getattr(heads, n)[...]) for n in ("lambda_q1", "lambda_k1",
                                                       "lambda_q2", "lambda_k2")]
  assert all(v.shape == (128,) for v in vecs)
  assert 0.09 < np.std(np.concatenate(vecs)) < 0.11
  assert len({v.tobytes() for v in vecs}) == 4  # four independent draws
  q1, k1, q2, k2 = vecs
  want = math.exp(q1 @ k1) - math.exp(q2 @ k2) + heads.lambda_init
  assert float(heads.lam()) == pytest.approx(want, rel=1e-5)
  np.testing.assert_array_equal(heads.norm_gain[...], np.ones(256))


def _papers_layer(attn, x_BTD, causal=True):
  """The differential layer written out (float64 numpy), from the layer's weights:
  per head n, [softmax(q1 k1^T / sqrt(H)) - lambda softmax(q2 k2^T / sqrt(H))] v, then
  RMSNorm (eps 1e-5, gain) x (1 - lambda_init), heads concatenated, output projection.
  Map c of head n reads map c of key/value head n // G."""
  cfg = attn.cfg
  w = lambda dense: np.asarray(dense.kernel[...], np.float64)
  x = np.asarray(x_BTD, np.float64)
  B, T, _ = x.shape
  N, K, H = cfg.num_heads // 2, cfg.kv_heads // 2, cfg.head_dim
  q = (x @ w(attn.q_proj)).reshape(B, T, 2, N, H)  # [maps, heads]: the first maps first
  k = (x @ w(attn.k_proj)).reshape(B, T, 2, K, H)
  v = (x @ w(attn.v_proj)).reshape(B, T, K, 2 * H)
  d = attn.differential
  lam = float(d.lam())
  visible = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
  heads = []
  for n in range(N):
    p = []
    for c in range(2):
      logits = q[:, :, c, n] @ k[:, :, c, n // (N // K)].transpose(0, 2, 1) / math.sqrt(H)
      logits = np.where(visible, logits, -np.inf)
      e = np.exp(logits - logits.max(-1, keepdims=True))
      p.append(e / e.sum(-1, keepdims=True))
    z = (p[0] - lam * p[1]) @ v[:, :, n // (N // K)]
    z = z / np.sqrt(np.mean(z**2, -1, keepdims=True) + 1e-5)
    heads.append(z * np.asarray(d.norm_gain[...]) * (1 - d.lambda_init))
  return np.concatenate(heads, -1) @ w(attn.out_proj)


@pytest.mark.parametrize("kv_heads", [4, 2])  # multi-head and grouped-query
@pytest.mark.parametrize("impl", [None, "reference"])
def test_layer_is_the_papers_formula(kv_heads, impl):
  m = build(tiny(num_kv_heads=kv_heads, attention_impl=impl))
  attn = m.blocks[1].attn
  key = jax.random.key(3)
  # Lambda away from its init and a gain that is not 1, so both are checked.
  for i, name in enumerate(("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")):
    getattr(attn.differential, name)[...] = 0.3 * jax.random.normal(
        jax.random.fold_in(key, i), (8,))
  attn.differential.norm_gain[...] = 1 + 0.5 * jax.random.normal(key, (16,))
  x_BTD = jax.random.normal(jax.random.key(4), (2, 10, 32))
  np.testing.assert_allclose(attn(x_BTD), _papers_layer(attn, x_BTD), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("fields", [dict(width=384, num_heads=6, num_layers=6),  # nanogpt
                                    dict(width=32, num_heads=2, num_layers=2),  # test preset
                                    dict(width=64, num_heads=8, num_kv_heads=2, num_layers=4)])
def test_parameter_count_is_the_standard_models(fields):
  count = lambda cfg: sum(x.size for x in jax.tree.leaves(
      nnx.state(nnx.eval_shape(lambda: build(cfg)), nnx.Param)))
  cfg = tiny(**fields)
  standard, diff = count(dataclasses.replace(cfg, differential=False)), count(cfg)
  # The same matrices; lambda's four vectors [H] and the norm's gain [2 H] per layer.
  assert diff - standard == 6 * cfg.head_dim * cfg.num_layers
  assert diff / standard - 1 < 0.01


def test_the_attention_call_is_what_the_layer_attends_with():
  """The diagnostics' contract (`Model.layer_trace`): each layer's AttentionCall is
  its one kernel call of the two maps (N heads, values 2 H wide), from which the
  layer's output follows; eval's diagnostics read both maps as heads."""
  m = build(tiny(num_kv_heads=2))
  tokens_BT = jax.random.randint(jax.random.key(1), (2, 10), 0, V)
  x_BTD = m.embed_tokens(tokens_BT)
  (c, _), *_ = m.layer_trace(tokens_BT)
  assert (c.q_BTNH.shape, c.k_BSKH.shape, c.v_BSKH.shape) == (
      (2, 10, 4, 8), (2, 10, 2, 8), (2, 10, 2, 16))
  z_BTNV = attnscale.attention(c.q_BTNH, c.k_BSKH, c.v_BSKH, **c.options())
  block = m.blocks[0]
  out = block.attn.project_out(block.attn.differential(z_BTNV).reshape(2, 10, 32))
  np.testing.assert_allclose(out, block.attn(block.attn_input(x_BTD)), rtol=1e-5, atol=1e-6)
  for layer in diagnostics.model_attention_stats(m, tokens_BT):
    assert all(len(v) == 4 for v in layer["heads"].values())
    assert all(np.isfinite(v) for k, v in layer.items() if k != "heads")


# ---------------------------------------------------------------------------
# Values wider than q and k (the paper's 2 H) on every kernel.


def _wide_values(seed=0, H=8):
  q, k, _ = random_qkv(seed=seed, T=10, S=10, N=4, K=2, H=H)
  v = jax.random.normal(jax.random.key(seed + 7), (2, 10, 2, 2 * H))
  return q, k, v


# Splash in Pallas interpret mode: an accelerator path, as tests/test_splash_attention.py.
@pytest.mark.parametrize("implementation", [
    "xla", pytest.param("splash", marks=pytest.mark.accelerator)])
def test_values_wider_than_q_and_k(implementation, monkeypatch):
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)  # T = 10: two causal blocks
  q, k, v = _wide_values()
  kw = dict(is_causal=True, mask=padding_mask([10, 6], 10))
  if implementation == "splash":  # a key mask is all splash takes; a sink it applies itself
    kw["sink"] = jnp.array([0.5, -1.0, 2.0, 0.0])
  else:  # the XLA kernel takes any scaling
    kw["scale_fn"] = scalings.get("key_norm_sum")
  f = lambda impl: lambda q, k, v: attnscale.attention(q, k, v, implementation=impl, **kw)
  np.testing.assert_allclose(f(implementation)(q, k, v), f("reference")(q, k, v),
                             rtol=2e-5, atol=2e-5)
  w = jax.random.normal(jax.random.key(9), (2, 10, 4, 16))
  grad = lambda g: jax.grad(lambda *a: jnp.sum(g(*a) * w), argnums=(0, 1, 2))(q, k, v)
  for got, want in zip(grad(f(implementation)), grad(f("reference"))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_value_slices_are_exact():
  # A kernel that takes values as wide as q only: 2 H in two calls, 1.5 H in two padded.
  q, k, _ = random_qkv(T=6, S=6, N=2, K=2, H=4)
  for width in (8, 6):
    v = jax.random.normal(jax.random.key(width), (2, 6, 2, width))

    def narrow(v_slice):
      assert v_slice.shape[-1] == 4
      return attnscale.attention(q, k, v_slice, is_causal=True)
    np.testing.assert_allclose(fused.by_value_slices(narrow, v, 4),
                               attnscale.attention(q, k, v, is_causal=True), rtol=1e-6,
                               atol=1e-6)


def test_differential_attention_with_wide_values():
  q1, k1, v = _wide_values()
  q2, k2, _ = _wide_values(seed=3)
  one = lambda q, k: attnscale.attention(q, k, v, is_causal=True)
  np.testing.assert_allclose(
      differential.differential_attention(q1, q2, k1, k2, v, 0.4, is_causal=True),
      one(q1, k1) - 0.4 * one(q2, k2), rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------
# Config: refusals, run label, packing.


@pytest.mark.parametrize("fields, match", [
    (dict(num_heads=3, width=24), r"needs an even model.num_heads .* got 3"),
    (dict(num_kv_heads=1), r"needs an even model.num_kv_heads .* got 1"),
    (dict(shared_kv=True), r"cannot take model.shared_kv=True"),
    (dict(attn_gate="headwise"), r"cannot take model.attn_gate='headwise'"),
    (dict(parameterization="mup"), r"model.parameterization='mup' cannot apply to "
                                   r"model.differential=True"),
    (dict(variant="unit", scaling="fully_scaled"),
     r"model.differential=True is not available in model.variant='unit'"),
])
def test_config_refuses_what_it_cannot_take(fields, match):
  with pytest.raises(ValueError, match=match) as e:
    tiny(**fields)
  assert "\n" not in str(e.value)


def test_run_label_and_packing():
  config = shakespeare_char.get_config("preset=test")
  other = shakespeare_char.get_config("preset=test")
  other.model.differential = True
  assert labels.run_label(config) == "standard"
  assert labels.run_label(other) == "standard+diff"
  other.model.forget_gate = True
  assert labels.run_label(other) == "standard+fox+diff"
  # A model field: a pack's runs are all differential or none.
  assert packing.pack_key(config) != packing.pack_key(other)
  other.model.forget_gate = False
  with pytest.raises(ValueError, match=r"differs from run 0 in model.differential"):
    packing.check_packable([config, other])


# ---------------------------------------------------------------------------
# A tiny run through train.py's path, then eval.py's diagnostics on its checkpoint.


def test_trains_and_evaluates(tmp_path_factory):
  run = testing.train_tiny_run(tmp_path_factory, steps=3, evaluate=True,
                               overrides={"model.differential": True, "eval_batches": 1})
  # Both maps of each of num_heads / 2 heads are diagnosed as heads.
  testing.assert_trained_and_evaluated(run, "standard+diff")
  assert run.metrics["loss"] < math.log(65) + 0.5


def test_lambda_and_the_norm_learn():
  m = build(tiny())
  tokens = np.random.default_rng(3).integers(0, V, (2, 16)).astype(np.int32)
  grads = nnx.grad(lambda m: jnp.mean(m(tokens) ** 2))(m)
  for i in range(2):
    for name, g in grads["blocks"][i]["attn"]["differential"].items():
      assert np.all(np.asarray(jax.tree.leaves(g)[0]) != 0), (i, name)
