"""Properties that follow from each scaling's formula, and the published numbers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

TOL = dict(rtol=1e-5, atol=1e-5)


def attend(q, k, v, name, **kw):
  params = {k_: kw.pop(k_) for k_ in ("p", "temperature") if k_ in kw}
  return attnscale.attention(q, k, v, scale_fn=scalings.get(name, **params), **kw)


def test_registry_names_and_unknown_name():
  assert set(scalings.names()) >= {"standard", "none", "key_norm_sum", "key_norm_mean",
                                   "key_norm_power", "cosine", "qk_layernorm",
                                   "fully_scaled"}
  with pytest.raises(ValueError, match=r"scaling must be one of \[.*'standard'.*\]"):
    scalings.get("sqrt_d")
  with pytest.raises(ValueError, match="p must be >= 0"):
    scalings.get("key_norm_power", p=-1.0)
  with pytest.raises(ValueError, match="bad params"):
    scalings.get("standard", temperature=2.0)


def test_each_scaling_documents_formula_and_source():
  for name in scalings.names():
    doc = type(scalings.get(name)).__doc__ or ""
    assert "=" in doc and any(s in doc for s in ("20", "unscaled")), name


@pytest.mark.parametrize("is_causal", [False, True])
def test_key_norm_sum_invariant_to_rescaling_keys(is_causal):
  q, k, v = random_qkv()
  base = attend(q, k, v, "key_norm_sum", is_causal=is_causal)
  np.testing.assert_allclose(attend(q, 7.5 * k, v, "key_norm_sum", is_causal=is_causal),
                             base, **TOL)
  # ... but not to rescaling queries: the scale is 1 / sum ||k||, not a normalisation of q.
  assert not np.allclose(attend(3 * q, k, v, "key_norm_sum", is_causal=is_causal), base)


def test_key_norm_mean_is_sum_times_n():
  q, k, v = random_qkv()
  # s_mean = n * s_sum, so feeding n * q to key_norm_sum equals key_norm_mean (non-causal).
  np.testing.assert_allclose(attend(q, k, v, "key_norm_mean"),
                             attend(12 * q, k, v, "key_norm_sum"), **TOL)


def test_key_norm_power_one_is_sum_and_zero_is_one_over_n():
  q, k, v = random_qkv()
  np.testing.assert_allclose(attend(q, k, v, "key_norm_power", p=1.0),
                             attend(q, k, v, "key_norm_sum"), **TOL)
  np.testing.assert_allclose(attend(q, k, v, "key_norm_power", p=0.0, is_causal=True),
                             attend(q / jnp.arange(1, 13)[None, :, None, None], k, v, "none",
                                    is_causal=True), **TOL)


def test_cosine_invariant_to_rescaling_any_q_or_k():
  q, k, v = random_qkv()
  base = attend(q, k, v, "cosine", temperature=8.0)
  scale_q = jax.random.uniform(jax.random.key(1), q.shape[:3] + (1,), minval=0.1, maxval=10)
  scale_k = jax.random.uniform(jax.random.key(2), k.shape[:3] + (1,), minval=0.1, maxval=10)
  np.testing.assert_allclose(attend(q * scale_q, k * scale_k, v, "cosine", temperature=8.0),
                             base, **TOL)


def test_cosine_default_temperature_is_henry_init():
  assert math.isclose(scalings.cosine_temperature_init(256), math.log2(256**2 - 256))
  q, k, v = random_qkv()
  np.testing.assert_allclose(attend(q, k, v, "cosine"),
                             attend(q, k, v, "cosine", temperature=math.log2(12**2 - 12)),
                             **TOL)


def test_qk_layernorm_invariant_to_affine_rescaling():
  q, k, v = random_qkv()
  base = attend(q, k, v, "qk_layernorm")
  np.testing.assert_allclose(attend(3 * q + 1, 0.5 * k - 2, v, "qk_layernorm"), base,
                             rtol=1e-4, atol=1e-4)


def test_none_is_standard_times_sqrt_d():
  q, k, v = random_qkv()
  np.testing.assert_allclose(attend(q, k, v, "none"), attend(np.sqrt(8) * q, k, v, "standard"),
                             **TOL)


def test_fully_scaled_is_standard_times_sqrt_n_over_e():
  q, k, v = random_qkv(T=64, S=64)
  np.testing.assert_allclose(attend(q, k, v, "fully_scaled"),
                             attend(q, k, v, "standard") * np.sqrt(64 / np.e), **TOL)
  # Causal rule: max(1, sqrt(n_i / e)), n_i = i + 1.
  c = np.maximum(1.0, np.sqrt(np.arange(1, 65) / np.e))[None, :, None, None]
  np.testing.assert_allclose(attend(q, k, v, "fully_scaled", is_causal=True),
                             attend(q, k, v, "standard", is_causal=True) * c, **TOL)
  # Padding: n counts only real keys.
  mask = padding_mask([64, 20], 64)
  got = attend(q, k, v, "fully_scaled", mask=mask)
  np.testing.assert_allclose(got[1], attend(q, k, v, "standard", mask=mask)[1]
                             * np.sqrt(20 / np.e), **TOL)


def _output_std(name, n, d=64, is_causal=False, seed=0):
  q, k, v = random_qkv(seed=seed, B=8, T=n, S=n, N=4, K=4, H=d)
  return float(jnp.std(attend(q, k, v, name, is_causal=is_causal)))


def test_graphcore_output_scale_numbers():
  # docs/science.md, "Why the standard output shrinks with n": q, k, v ~ N(0, 1), n = 256, d = 64: standard std about 0.10
  # (theory sqrt(e/n) = 0.103), fully scaled about 1.0.
  standard = _output_std("standard", 256)
  assert abs(standard - math.sqrt(math.e / 256)) < 0.01, standard
  fully = _output_std("fully_scaled", 256)
  assert abs(fully - 1.0) < 0.1, fully


def test_graphcore_theory_across_n():
  for n in (64, 1024):
    assert abs(_output_std("standard", n) / math.sqrt(math.e / n) - 1) < 0.1


@pytest.mark.parametrize("kwargs,match", [
    (dict(q=(2, 12, 4), k=None, v=None), "q must have rank 4"),
    (dict(q=None, k=(2, 12, 2, 8, 1), v=(2, 12, 2, 8, 1)), "k must have rank 4"),
    (dict(q=None, k=(2, 12, 2, 6), v=(2, 12, 2, 6)), "same head_dim"),
    (dict(q=None, k=None, v=(2, 11, 2, 8)), r"k and v must have the same \[batch, kv_len, kv_heads\]"),
    (dict(q=None, k=(2, 12, 3, 8), v=(2, 12, 3, 8)), r"kv_heads \(3\) must divide heads \(4\)"),
    (dict(q=(3, 12, 4, 8), k=None, v=None), "same batch size"),
])
def test_bad_shapes(kwargs, match):
  q, k, v = random_qkv()
  args = [jnp.zeros(s) if s is not None else x for s, x in
          zip((kwargs["q"], kwargs["k"], kwargs["v"]), (q, k, v))]
  with pytest.raises(ValueError, match=match):
    attnscale.attention(*args)


def test_bad_mask_and_options():
  q, k, v = random_qkv()
  with pytest.raises(ValueError, match=r"mask must broadcast to \[batch, heads, q_len, kv_len\]"):
    attnscale.attention(q, k, v, mask=jnp.ones((2, 1, 1, 11), bool))
  with pytest.raises(ValueError, match="mask must be boolean"):
    attnscale.attention(q, k, v, mask=jnp.ones((2, 1, 1, 12)))
  with pytest.raises(ValueError, match="implementation must be one of"):
    attnscale.attention(q, k, v, implementation="flash")
  with pytest.raises(ValueError, match="normalizer must be one of"):
    attnscale.attention(q, k, v, normalizer="softmin")
  with pytest.raises(ValueError, match="one dtype"):
    attnscale.attention(q, k.astype(jnp.bfloat16), v)


def test_user_defined_scaling_runs_on_both_paths():
  def key_norm_sqrt(q, k, keys):
    norms = scalings.safe_norm_pow(k)  # [B, S, K]
    return attnscale.Scaled(q, k, logit_scale=1.0 / jnp.sqrt(keys.sum(norms)))

  q, k, v = random_qkv()
  ref = attnscale.attention(q, k, v, scale_fn=key_norm_sqrt, is_causal=True,
                            implementation="reference")
  np.testing.assert_allclose(attnscale.attention(q, k, v, scale_fn=key_norm_sqrt,
                                                 is_causal=True), ref, **TOL)


# ---------------------------------------------------------------------------
# The log-n scalings (issue: length generalisation).


def _logit_scale(name, T, *, causal, **params):
  from attnscale.core.visibility import VisibleKeys
  q = jnp.ones((1, T, 2, 16))
  keys = VisibleKeys(None, causal, T, T, 2, 2)
  s = scalings.get(name, **params)(q, q, keys).logit_scale
  return np.broadcast_to(np.asarray(s), (1, T, 2))


def test_log_n_is_standard_at_the_training_length():
  from attnscale.core.length_scalings import log_n_init
  from attnscale.core.scalings import Dims
  L = 64
  s0 = log_n_init(Dims(heads=2, kv_heads=2, head_dim=16, train_len=L))
  assert s0 == pytest.approx(1 / np.log(L))
  s = _logit_scale("log_n", L, causal=True, s=s0)
  # Query i sees n_i = i + 1 keys: s0 * log(n_i) / sqrt(d); standard (1/4) at n = L.
  np.testing.assert_allclose(s[0, :, 0], s0 * np.log(np.arange(1, L + 1)) / 4, rtol=1e-6)
  assert s[0, -1, 0] == pytest.approx(0.25)
  # Per-head s: one value per head, the model's learned form.
  s = _logit_scale("log_n", 8, causal=False, s=jnp.array([1.0, 2.0]))
  np.testing.assert_allclose(s[0, 0], np.array([1.0, 2.0]) * np.log(8) / 4, rtol=1e-6)
  # The default (Chiang & Cholak 2022): s = 1.
  np.testing.assert_allclose(_logit_scale("log_n", 8, causal=False)[0, 0, 0], np.log(8) / 4,
                             rtol=1e-6)


def test_log_n_ratio_is_standard_up_to_the_training_length_and_sharper_past_it():
  T, L = 64, 16
  s = _logit_scale("log_n_ratio", T, causal=True, train_len=L)[0, :, 0]
  n = np.arange(1, T + 1)
  np.testing.assert_allclose(s[:L], 0.25)
  np.testing.assert_allclose(s[L:], np.log(n[L:]) / np.log(L) / 4, rtol=1e-6)
  assert s[-1] == pytest.approx(1.5 / 4)  # log_16(64) = 1.5
  assert scalings.get("log_n_ratio").train_len == 2048  # analysis default
  with pytest.raises(ValueError, match="train_len must be >= 2"):
    scalings.get("log_n_ratio", train_len=1)


def test_model_fills_log_n_ratio_train_len_and_learns_log_n_per_head():
  from flax import nnx

  from attnscale import models
  from attnscale.models import ModelConfig
  cfg = dict(vocab_size=11, block_size=32, num_layers=1, num_heads=2, width=16)
  ratio = models.build(ModelConfig(scaling="log_n_ratio", **cfg), rngs=nnx.Rngs(0))
  assert ratio.blocks[0].attn.scaling().train_len == 32
  fixed = models.build(ModelConfig(scaling="log_n_ratio", scaling_params={"train_len": 8}, **cfg),
                       rngs=nnx.Rngs(0))
  assert fixed.blocks[0].attn.scaling().train_len == 8
  log_n = models.build(ModelConfig(scaling="log_n", **cfg), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(log_n.blocks[0].attn.scaling.s[...], [1 / np.log(32)] * 2,
                             rtol=1e-6)


def test_qk_rmsnorm_and_inverse_d():
  from attnscale.core.visibility import VisibleKeys
  q, k, _ = random_qkv()
  keys = VisibleKeys(None, False, 12, 12, 4, 2)
  out = scalings.get("qk_rmsnorm", q_scale=jnp.full((8,), 2.0))(q, k, keys)
  rms = np.sqrt(np.mean(np.square(np.asarray(q)), -1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(out.q, 2 * np.asarray(q) / rms, rtol=1e-5)
  np.testing.assert_allclose(np.sqrt(np.mean(np.square(out.k), -1)), 1.0, rtol=1e-3)
  assert out.logit_scale == pytest.approx(8**-0.5)
  assert scalings.get("inverse_d")(q, k, keys).logit_scale == pytest.approx(1 / 8)
  assert scalings.get("inverse_d", mult=4.0).init_logit_scale(8) == pytest.approx(0.5)

