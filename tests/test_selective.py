"""Selective attention (`attention(..., selective=True)`, `model.selective`; Leviathan,
Kalman & Matias 2024, arXiv 2410.02703): against the paper's Listing 1 written out
in numpy loops, fused == reference in values and gradients across scalings and
options, no future leak, prefix == full, one-line refusals, and a tiny train.py run
with eval.py's diagnostics. (Whole models' leaks, padding and reference == fused:
tests/test_attention_options.py, which takes it with the other options.)"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnscale
from attnscale import models, testing
from attnscale.config import labels
from attnscale.core import scalings, selective, xla_attention
from attnscale.testing import padding_mask, random_qkv
from configs import shakespeare_char

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.fixture(autouse=True)
def two_causal_blocks(monkeypatch):
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)  # T = 10: two causal blocks


def _written_out(q, k, v, lengths):
  """The paper's Listing 1, float64, one batch row and head at a time: head 0's
  causal logits q.k / sqrt(H), relu'd, the <BOS> column and the diagonal zeroed,
  shifted down one query and summed over the queries; F subtracted from every head."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, N, H = q.shape
  G = N // k.shape[2]
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  for b in range(B):
    visible = np.tril(np.ones((T, T), bool)) & (np.arange(T) < lengths[b])[None, :]
    logits = np.einsum("tnh,snh->nts", q[b], np.repeat(k[b], G, axis=1)) / math.sqrt(H)
    s = np.where(visible, np.maximum(logits[0], 0), 0.0)
    s[:, 0] = 0  # do not mask <BOS>
    s *= 1 - np.eye(T)  # do not mask self
    s = np.roll(s, 1, axis=0)
    s[0] = 0  # mask strictly in the future
    f = np.cumsum(s, axis=0)
    for n in range(N):
      x = np.where(visible, logits[n] - f, -np.inf)
      p = np.exp(x - x.max(-1, keepdims=True))
      out[b, :, n] = (p / p.sum(-1, keepdims=True)) @ v[b, :, n // G]
  return out


@pytest.mark.parametrize("N, K", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("implementation", ["reference", None])
def test_is_the_papers_listing(N, K, implementation):
  # Large logits, so that relu(l0) is far from 0 and F changes the weights.
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  q = 3 * q
  lengths = [10, 7]
  got = attnscale.attention(q, k, v, is_causal=True, selective=True,
                            mask=padding_mask(lengths, 10), implementation=implementation)
  want = _written_out(q, k, v, lengths)
  np.testing.assert_allclose(got[1, :7], want[1, :7], **TOL)  # real queries
  np.testing.assert_allclose(got[0], want[0], **TOL)
  plain = attnscale.attention(q, k, v, is_causal=True, mask=padding_mask(lengths, 10))
  assert not np.allclose(got, plain, atol=1e-3)  # the selection is real


def test_selection_bias_spares_the_first_key_the_diagonal_and_the_first_query():
  l0 = jax.random.normal(jax.random.key(0), (2, 8, 8)) + 1.0
  f = np.asarray(selective.selection_bias(l0, selective.visible_BTS(None, 8, 8)))
  assert np.all(f[:, :, 0] == 0) and np.all(f[:, 0] == 0)
  assert np.all(np.diagonal(f, axis1=1, axis2=2) == 0)
  assert np.all(f >= 0) and np.all(np.triu(f[0], 1) == 0)  # no future key is touched
  # F_ij = sum_{k<i} relu(l0_kj) for 0 < j < k.
  s = np.where(np.tril(np.ones((8, 8)), -1) * (np.arange(8) > 0), np.maximum(l0, 0), 0)
  np.testing.assert_allclose(f[:, 5, 2], s[:, :5, 2].sum(1), rtol=1e-6)


OPTIONS = {
    "plain": {},
    "softcap_sink": dict(logit_softcap=2.0, sink=jnp.array([0.5, -1.0, 2.0, 0.0])),
    "fox_relu": dict(normalizer="relu", log_forget=-jax.nn.softplus(
        jax.random.normal(jax.random.key(8), (2, 10, 4)))),
    "sigmoid": dict(normalizer="sigmoid"),
}


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("scaling", ["standard", "key_norm_sum", "cosine", "scale_invariant"])
def test_fused_equals_reference(scaling, option):
  q, k, v = random_qkv(T=10, S=10, N=4, K=2)
  kw = dict(scale_fn=scalings.get(scaling), is_causal=True, selective=True,
            mask=padding_mask([10, 6], 10), **OPTIONS[option])
  f = lambda impl: lambda q, k, v: attnscale.attention(q, k, v, implementation=impl, **kw)
  np.testing.assert_allclose(f(None)(q, k, v), f("reference")(q, k, v), **TOL)
  stats = lambda impl: attnscale.attention(q, k, v, implementation=impl, return_stats=True,
                                           **kw)[1]
  for got, want in zip(stats(None), stats("reference")):  # the largest logit includes -F
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  w = jax.random.normal(jax.random.key(9), q.shape)
  grad = lambda g: jax.grad(lambda *a: jnp.sum(g(*a) * w), argnums=(0, 1, 2))(q, k, v)
  for got, want in zip(grad(f(None)), grad(f("reference"))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", None])
def test_no_future_leak_and_prefix_equals_full(implementation):
  q, k, v = random_qkv(T=10, S=10)
  q = 3 * q
  attend = lambda q, k, v: attnscale.attention(q, k, v, is_causal=True, selective=True,
                                               implementation=implementation)
  full = np.asarray(attend(q, k, v))
  for i in (0, 4, 8):
    np.testing.assert_allclose(attend(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1]),
                               full[:, :i + 1], **TOL)
    noise_q, noise_k, noise_v = random_qkv(seed=i + 1, T=10, S=10)
    later = lambda x, n, i=i: x.at[:, i + 1:].set(10 * n[:, i + 1:])
    out = np.asarray(attend(later(q, noise_q), later(k, noise_k), later(v, noise_v)))
    np.testing.assert_array_equal(out[:, :i + 1], full[:, :i + 1])
  # d out_i / d (q, k, v)_j = 0 for j > i: head 0's later queries select for later ones only.
  grads = jax.grad(lambda q, k, v: attend(q, k, v)[:, 4].sum(), argnums=(0, 1, 2))(q, k, v)
  assert all(np.all(np.asarray(g[:, 5:]) == 0) for g in grads)


def test_diagnostics_weights_include_the_selection():
  q, k, _ = random_qkv(T=10, S=10)
  kw = dict(is_causal=True, selective=True)
  _, p = attnscale.attention_weights(3 * q, k, **kw)
  _, plain = attnscale.attention_weights(3 * q, k, is_causal=True)
  np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, rtol=1e-5)
  assert not np.allclose(p, plain, atol=1e-3)


def test_the_default_runs_the_xla_kernel_on_every_platform(monkeypatch):
  from attnscale.core import fused
  args = ((2, 8, 4, 16), (2, 8, 2, 16), jnp.bfloat16, None, "softmax", None, None)
  for platform, plain in (("tpu", "splash"), ("gpu", "cudnn")):
    monkeypatch.setattr(fused, "target_platform", lambda platform=platform: platform)
    assert fused.kernel_for(None, *args) == plain
    assert fused.kernel_for(None, *args, pair_bias=True) == "xla"


@pytest.mark.parametrize("kwargs, match", [
    (dict(selective=True), r"selective needs causal self-attention"),
    (dict(selective=True, is_causal=True, implementation="splash"),
     r"implementation='splash' cannot take selective"),
    (dict(selective=True, is_causal=True, implementation="cudnn"),
     r"implementation='cudnn' cannot take selective"),
])
def test_bad_options(kwargs, match):
  q, k, v = random_qkv(T=10, S=10)
  with pytest.raises(ValueError, match=match) as e:
    attnscale.attention(q, k, v, **kwargs)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields, match", [
    (dict(causal=False), r"model.selective=True needs model.causal=True"),
    (dict(attention_impl="splash"), r"model.selective=True cannot run on "
                                    r"model.attention_impl='splash'"),
    (dict(differential=True), r"model.differential=True cannot take model.selective=True"),
])
def test_config_refusals(fields, match):
  with pytest.raises(ValueError, match=match) as e:
    models.ModelConfig(selective=True, **fields)
  assert "\n" not in str(e.value)


def test_unit_variant_takes_it_and_the_run_label_says_so():
  cfg = models.ModelConfig(vocab_size=13, block_size=16, num_layers=2, num_heads=2, width=16,
                           variant="unit", scaling="fully_scaled", selective=True)
  m = models.build(cfg, rngs=nnx.Rngs(params=0))
  tokens = np.random.default_rng(0).integers(0, 13, (2, 16)).astype(np.int32)
  np.testing.assert_allclose(m(tokens[:, :6]), m(tokens)[:, :6], rtol=1e-5, atol=1e-5)
  config = shakespeare_char.get_config("preset=test")
  config.model.selective = True
  assert labels.run_label(config) == "standard+selective"


def test_trains_and_evaluates(tmp_path_factory):
  run = testing.train_tiny_run(tmp_path_factory, steps=3, evaluate=True,
                               overrides={"model.selective": True, "eval_batches": 1})
  testing.assert_trained_and_evaluated(run, "standard+selective")
