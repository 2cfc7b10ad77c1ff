"""model.dtype = "bfloat16": bf16 products, float32 params, residual stream, softmax,
logits and gradients, and the same model as float32 up to bf16 rounding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale.models import ModelConfig, Transformer, UnitScaledTransformer

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

CASES = {
    "gpt": (Transformer, dict(scaling="standard")),
    "gpt_key_norm_sum": (Transformer, dict(scaling="key_norm_sum")),
    "bert_post_ln": (Transformer, dict(causal=False, ln_position="post", head="mlm")),
    "unit_scaled": (UnitScaledTransformer, dict(variant="unit", scaling="umup")),
}


def _models(case):
  cls, kw = CASES[case]
  cfg = ModelConfig(vocab_size=50, block_size=32, num_layers=2, num_heads=4, width=64, **kw)
  f32 = cls(cfg, rngs=nnx.Rngs(0))
  bf16 = cls(dataclasses.replace(cfg, dtype="bfloat16"), rngs=nnx.Rngs(0))
  return f32, bf16


def _loss_and_grads(model, tokens):
  def loss(model):
    logits = model(tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0]), logits
  (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return value, logits, grads


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_compute_float32_everything_else(case):
  f32, bf16 = _models(case)
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 50)
  params = jax.tree.leaves(nnx.state(bf16, nnx.Param))
  assert all(p.dtype == jnp.float32 for p in params)
  loss32, logits32, grads32 = _loss_and_grads(f32, tokens)
  loss16, logits16, grads16 = _loss_and_grads(bf16, tokens)
  assert logits16.dtype == jnp.float32 and loss16.dtype == jnp.float32
  np.testing.assert_allclose(loss16, loss32, rtol=2e-2)
  # Same model up to bf16 rounding: logits to a few percent of their spread.
  assert float(jnp.max(jnp.abs(logits16 - logits32))) < 0.05 * float(jnp.std(logits32)) + 1e-3
  g32 = jnp.concatenate([g.ravel() for g in jax.tree.leaves(grads32)])
  g16 = jnp.concatenate([g.ravel() for g in jax.tree.leaves(grads16)])
  assert g16.dtype == jnp.float32
  cosine = jnp.dot(g16, g32) / (jnp.linalg.norm(g16) * jnp.linalg.norm(g32))
  assert cosine > 0.99, cosine


def test_bf16_residual_stream_stays_float32():
  _, bf16 = _models("gpt")
  x = bf16.residual_stream(jnp.zeros((1, 8), jnp.int32))
  assert x.dtype == jnp.float32
