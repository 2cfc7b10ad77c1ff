"""The 2025 temperature scalings and critical log-n: their formulas, standard within the
training length, and log_n with a fixed s (critical log-n scaling) through the model
config. Causality, padding and reference == fused are the registry-wide grids'
(SCALING_CASES in attnscale/testing.py)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnscale
from attnscale import models
from attnscale.core import scalings
from attnscale.core.visibility import VisibleKeys
from attnscale.testing import random_qkv


def _scale(name, T, is_causal=True, **params):
  q, k, _ = random_qkv(T=T, S=T, H=16)
  keys = VisibleKeys(None, is_causal, T, T, q.shape[2], k.shape[2])
  s = scalings.get(name, **params)(q, k, keys).logit_scale
  return np.broadcast_to(np.asarray(s), (1, T, q.shape[2]))[0, :, 0] * math.sqrt(16)


def test_temperature_tuning_is_llama4s_formula():
  got = _scale("temperature_tuning", 20, beta=0.1, floor_scale=4)
  i = np.arange(20)
  np.testing.assert_allclose(got, 1 + 0.1 * np.log(np.floor((i + 1) / 4) + 1), rtol=1e-6)
  assert np.all(got[:3] == 1.0) and got[3] > 1.0  # standard below floor_scale - 1


def test_yarn_is_standard_within_the_training_length_then_its_square():
  got = _scale("yarn", 20, train_len=8)
  n = np.arange(1, 21)  # causal: query i sees i + 1 keys
  np.testing.assert_allclose(got, (0.1 * np.log(np.maximum(n / 8, 1)) + 1) ** 2, rtol=1e-6)
  assert np.all(got[:8] == 1.0)
  # Bidirectional: every query sees all 20 keys.
  np.testing.assert_allclose(_scale("yarn", 20, is_causal=False, train_len=8),
                             (0.1 * math.log(20 / 8) + 1) ** 2, rtol=1e-6)


@pytest.mark.parametrize("name", ["temperature_tuning", "yarn"])
def test_a_model_takes_its_training_length(name):
  cfg = models.ModelConfig(vocab_size=11, block_size=16, num_layers=1, num_heads=2, width=16,
                           scaling=name)
  model = models.build(cfg, rngs=nnx.Rngs(0))
  fixed = dict(model.blocks[0].attn.scaling.fixed)
  assert fixed == ({"floor_scale": 16} if name == "temperature_tuning" else {"train_len": 16})


def test_critical_log_n_is_log_n_with_a_fixed_s():
  """Critical log-n scaling, logits x gamma log n_i: log_n with s = gamma fixed in
  model.scaling_params (no learned s), e.g. gamma = 1/(1 - rho) at the phase
  transition of log-n scaling."""
  gamma = 1.5
  cfg = models.ModelConfig(vocab_size=11, block_size=16, num_layers=1, num_heads=2, width=16,
                           scaling="log_n", scaling_params={"s": gamma})
  model = models.build(cfg, rngs=nnx.Rngs(0))
  layer = model.blocks[0].attn.scaling
  assert layer.learned_names == () and dict(layer.fixed) == {"s": gamma}
  q, k, v = random_qkv(T=12, S=12, H=16)
  z = attnscale.attention(q, k, v, scale_fn=layer(), is_causal=True)
  keys = VisibleKeys(None, True, 12, 12, 4, 2)
  want = attnscale.attention(q * (gamma * jnp.log(keys.count()) / 4.0)[..., None], k, v,
                             scale_fn=scalings.get("none"), is_causal=True)
  np.testing.assert_allclose(z, want, rtol=2e-5, atol=2e-5)
