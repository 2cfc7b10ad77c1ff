"""The XLA kernel of the fused path (`attnscale.core.xla_attention`) against a naive softmax
attention: causal blocks of every size, T != S, grouped heads, masks, gradients, bf16,
and its options (soft-cap, per-query bias, sigmoid, log-sum-exp)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import xla_attention
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")


def naive(q, k, v, mask=None, is_causal=False):
  """softmax(q k^T) v over the visible keys, in float32, heads grouped as n = k * G + g."""
  G = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32)
  visible = jnp.ones(logits.shape, bool)
  if is_causal:
    T, S = q.shape[1], k.shape[1]
    visible &= (jnp.arange(S)[None, :] <= jnp.arange(T)[:, None])[None, None]
  if mask is not None:
    visible &= mask
  p = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
  p = jnp.where(visible.any(-1, keepdims=True), p, 0.0)  # rows that see nothing
  return jnp.einsum("bnts,bsnh->btnh", p, v.astype(jnp.float32)), visible.any(-1)


# Uneven blocks with no grouping (K = N) and with one key head, one block larger
# than T, more queries than keys and more keys than queries (the compile of a
# many-block gradient is most of the cost, so each case covers one thing more).
@pytest.mark.parametrize("T,S,block_q,K", [(13, 13, 3, 4), (13, 13, 4, 1), (13, 13, 64, 2),
                                           (7, 5, 2, 2), (5, 9, 2, 1)])
def test_causal_blocks_agree_with_naive(T, S, block_q, K):
  q, k, v = random_qkv(T=T, S=S, N=4, K=K)
  w = jax.random.normal(jax.random.key(3), q.shape)  # a cotangent that sees every output

  def loss(f, q, k, v):
    return jnp.sum(f(q, k, v) * w)

  got_fn = lambda q, k, v: xla_attention.dot_product_attention(q, k, v, is_causal=True,
                                                              block_q=block_q)
  want_fn = lambda q, k, v: naive(q, k, v, is_causal=True)[0]
  # Jitted: op-by-op dispatch of the block loop and its transpose is most of the cost.
  np.testing.assert_allclose(jax.jit(got_fn)(q, k, v), want_fn(q, k, v), rtol=1e-5, atol=1e-5)
  got_g = jax.jit(jax.grad(lambda *a: loss(got_fn, *a), argnums=(0, 1, 2)))(q, k, v)
  want_g = jax.grad(lambda *a: loss(want_fn, *a), argnums=(0, 1, 2))(q, k, v)
  for got, want in zip(got_g, want_g):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_shape", ["padding", "per_query_head"])
def test_masks_agree_with_naive(is_causal, mask_shape):
  B, T, N, K = 3, 11, 4, 2
  q, k, v = random_qkv(B=B, T=T, S=T, N=N, K=K)
  if mask_shape == "padding":
    lengths = jnp.array([11, 6, 1])
    mask = (jnp.arange(T)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
  else:
    mask = jax.random.bernoulli(jax.random.key(5), 0.6, (B, N, T, T))
    mask = mask.at[0, 1, 4].set(False)  # a query that sees no key
  want, seen_BNT = naive(q, k, v, mask, is_causal)
  got = xla_attention.dot_product_attention(q, k, v, mask, is_causal, block_q=4)
  seen_BTN1 = seen_BNT.transpose(0, 2, 1)[..., None]
  assert np.all(np.isfinite(got))  # rows that see nothing: finite (attention() zeroes them)
  np.testing.assert_allclose(jnp.where(seen_BTN1, got, 0), want, rtol=1e-5, atol=1e-5)


def test_causal_blocks_cover_every_row_once():
  for T, S, block_q in [(128, 128, 32), (100, 100, 32), (7, 5, 2), (5, 9, 2), (3, 3, 64)]:
    blocks = xla_attention.causal_blocks(T, S, block_q)
    assert blocks[0][0] == 0 and blocks[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert all(s1 == min(t1, S) for _, t1, s1 in blocks)
    assert all(t1 - t0 >= min(T, block_q) // 2 for t0, t1, _ in blocks)
  assert len(xla_attention.causal_blocks(128, 128, 32)) == 4
  assert [len(xla_attention.causal_blocks(T, T, xla_attention.default_block_q(T)))
          for T in (16, 128, 256, 4096)] == [1, 4, 8, 8]


@pytest.mark.parametrize("case", ["causal", "causal_rect", "padding", "per_query_head",
                                  "bf16"])
def test_hand_written_backward_equals_autodiff(case):
  # The plain softmax path's custom VJP against autodiff through its own forward
  # ops: with causal blocks, T != S, grouped heads, masks with a query that sees no
  # key (its logits' gradient must be 0, as the forward's select makes it), bf16.
  B, T, S, N, K, dtype = 3, 11, 11, 4, 2, jnp.float32
  mask, is_causal = None, True
  if case == "causal_rect":
    T, S, K = 9, 13, 1
  elif case == "padding":
    mask, is_causal = padding_mask([11, 6, 1], S), False
  elif case == "per_query_head":
    mask = jax.random.bernoulli(jax.random.key(5), 0.6, (B, N, T, S))
    mask = mask.at[0, 1, 4].set(False)  # a query that sees no key
  elif case == "bf16":
    dtype = jnp.bfloat16
  q, k, v = random_qkv(B=B, T=T, S=S, N=N, K=K, dtype=dtype)
  w = jax.random.normal(jax.random.key(3), q.shape, dtype)

  def loss(attend, q, k, v):
    return jnp.sum((attend(q, k, v) * w).astype(jnp.float32))

  hand = lambda q, k, v: xla_attention.dot_product_attention(q, k, v, mask, is_causal,
                                                            block_q=4)
  auto = lambda q, k, v: xla_attention._softmax_attention_fwd(q, k, v, mask, is_causal, 4)[0]
  got = jax.jit(jax.grad(lambda *a: loss(hand, *a), argnums=(0, 1, 2)))(q, k, v)
  want = jax.jit(jax.grad(lambda *a: loss(auto, *a), argnums=(0, 1, 2)))(q, k, v)
  tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
  for g, h in zip(got, want):
    assert g.dtype == dtype
    np.testing.assert_allclose(g.astype(jnp.float32), h.astype(jnp.float32), rtol=tol, atol=tol)


def test_bf16_products_float32_softmax():
  q, k, v = random_qkv(T=40, S=40, N=4, K=2)
  want = xla_attention.dot_product_attention(q, k, v, is_causal=True, block_q=8)
  bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  got = xla_attention.dot_product_attention(*bf, is_causal=True, block_q=8)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=0, atol=3e-2)


@pytest.mark.parametrize("name", ["standard", "key_norm_sum", "fully_scaled"])
def test_attention_with_default_blocks_equals_reference(name):
  # T = 200 gets 6 causal blocks by default (the tests elsewhere use short sequences).
  q, k, v = random_qkv(B=1, T=200, S=200, N=2, K=2, H=8)
  assert len(xla_attention.causal_blocks(200, 200, xla_attention.default_block_q(200))) == 6
  kw = dict(scale_fn=attnscale.scalings.get(name), is_causal=True)
  np.testing.assert_allclose(attnscale.attention(q, k, v, **kw),
                             attnscale.attention(q, k, v, implementation="reference", **kw),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["standard", "key_norm_sum"])
def test_no_future_leak_across_causal_blocks(name):
  # T = 70 gets 2 causal blocks by default: a block's queries must see neither a
  # later block's keys nor keys past themselves inside their own block.
  T = 70
  assert len(xla_attention.causal_blocks(T, T, xla_attention.default_block_q(T))) == 2
  q, k, v = random_qkv(B=1, T=T, S=T, N=2, K=2)
  f = attnscale.scalings.get(name)
  attend = jax.jit(lambda q, k, v: attnscale.attention(q, k, v, scale_fn=f, is_causal=True))
  base = np.asarray(attend(q, k, v))
  for i in (0, 20, 34, 35, 50):  # 35 is the first row of the second block
    noise_k, noise_v = random_qkv(seed=i + 1, B=1, T=T, S=T, N=2, K=2)[1:]
    out = np.asarray(attend(q, k.at[:, i + 1:].set(10 * noise_k[:, i + 1:]),
                            v.at[:, i + 1:].set(10 * noise_v[:, i + 1:])))
    np.testing.assert_array_equal(out[:, :i + 1], base[:, :i + 1])
    assert not np.allclose(out[:, i + 1:], base[:, i + 1:])
  gk, gv = jax.grad(lambda k, v: attend(q, k, v)[:, 20].sum(), argnums=(0, 1))(k, v)
  assert np.all(np.asarray(gk[:, 21:]) == 0) and np.all(np.asarray(gv[:, 21:]) == 0)


def naive_options(q, k, v, mask, is_causal, normalizer, softcap, bias_BTN):
  """The kernel's options written out: (z, lse) over the visible keys, float32."""
  G = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k)
  if softcap is not None:
    logits = softcap * jnp.tanh(logits / softcap)
  if bias_BTN is not None:
    logits = logits + bias_BTN.transpose(0, 2, 1)[..., None]
  T, S = q.shape[1], k.shape[1]
  visible = jnp.broadcast_to(mask, logits.shape)
  if is_causal:
    visible &= (jnp.arange(S)[None, :] <= jnp.arange(T)[:, None])[None, None]
  if normalizer == "sigmoid":
    p = jnp.where(visible, jax.nn.sigmoid(logits), 0.0)
  else:
    p = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
  lse = jax.nn.logsumexp(jnp.where(visible, logits, -jnp.inf), axis=-1).transpose(0, 2, 1)
  return jnp.einsum("bnts,bsnh->btnh", p, v), lse


@pytest.mark.parametrize("is_causal,block_q", [(False, None), (True, 3), (True, 64)])
@pytest.mark.parametrize("options", ["softcap", "bias", "lse", "sigmoid", "sigmoid_softcap_bias"])
def test_options_agree_with_naive(options, is_causal, block_q):
  B, T, N, K = 2, 11, 4, 2
  q, k, v = random_qkv(B=B, T=T, S=T, N=N, K=K)
  mask = (jnp.arange(T)[None, :] < jnp.array([11, 7])[:, None])[:, None, None, :]
  bias_BTN = jax.random.normal(jax.random.key(4), (1, T, N))
  kw = dict(normalizer="sigmoid" if "sigmoid" in options else "softmax",
            softcap=1.5 if "softcap" in options else None,
            bias_BTN=bias_BTN if "bias" in options else None)
  lse = options == "lse"
  w = jax.random.normal(jax.random.key(3), q.shape)
  w_lse = jax.random.normal(jax.random.key(6), (B, T, N))

  def kernel(q, k, v):
    out = xla_attention.dot_product_attention(
        q, k, v, mask, is_causal, block_q, normalizer=kw["normalizer"],
        logit_softcap=kw["softcap"], logit_bias_BTN=kw["bias_BTN"], return_lse=lse)
    return out if lse else (out, None)

  def loss(f, q, k, v):
    z, lse_BTN = f(q, k, v)
    return jnp.sum(z * w) + (jnp.sum(lse_BTN * w_lse) if lse else 0.0), (z, lse_BTN)

  naive_fn = lambda q, k, v: naive_options(q, k, v, mask, is_causal, **kw)
  # Jitted: op-by-op dispatch (and its per-op compiles) is most of the cost.
  (_, (z, lse_got)), g = jax.jit(jax.value_and_grad(
      lambda *a: loss(kernel, *a), argnums=(0, 1, 2), has_aux=True))(q, k, v)
  (_, (z_want, lse_want)), g_want = jax.jit(jax.value_and_grad(
      lambda *a: loss(naive_fn, *a), argnums=(0, 1, 2), has_aux=True))(q, k, v)
  for got, want in zip((z, *g), (z_want, *g_want)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  if lse:
    np.testing.assert_allclose(lse_got, lse_want, rtol=1e-5, atol=1e-5)


def test_softmax_without_options_is_unchanged():
  # The plain path keeps jax.nn.softmax, not the (p, lse) helper: same ops, same bits.
  q, k, v = random_qkv(T=40, S=40, N=4, K=2)
  text = jax.jit(lambda q, k, v: xla_attention.dot_product_attention(
      q, k, v, is_causal=True, block_q=8)).lower(q, k, v).as_text()
  assert not re.search(r"stablehlo\.(tanh|logistic|log)\b", text)
  assert "stablehlo.exponential" in text  # the check looks at the right program
  z, _ = xla_attention.dot_product_attention(q, k, v, is_causal=True, block_q=8,
                                             return_lse=True)
  np.testing.assert_allclose(z, xla_attention.dot_product_attention(
      q, k, v, is_causal=True, block_q=8), rtol=1e-6, atol=1e-6)


def test_bad_kernel_options():
  q, k, v = random_qkv()
  with pytest.raises(ValueError, match="normalizer must be one of"):
    xla_attention.dot_product_attention(q, k, v, normalizer="softmin")  # relu is one now
  with pytest.raises(ValueError, match="log_forget_BTN needs causal self-attention"):
    xla_attention.dot_product_attention(q, k, v, log_forget_BTN=jnp.zeros(q.shape[:3]))
  with pytest.raises(ValueError, match="return_lse needs normalizer='softmax'"):
    xla_attention.dot_product_attention(q, k, v, normalizer="sigmoid", return_lse=True)


@pytest.mark.parametrize("case", ["softmax_causal", "padding_mask", "shared_mask_bias_lse",
                                  "sigmoid_stats"])
@pytest.mark.parametrize("batch_chunk", [1, 2, 4])
def test_batch_chunks_compute_the_whole_batchs_values_and_gradients(case, batch_chunk):
  """`batch_chunk` (groups of rows through a lax.map, the CPU default) changes only
  the products' shapes: outputs and gradients equal the whole batch's (B = 6, so
  4 runs groups of 3, the largest divisor)."""
  B, T, N, K = 6, 20, 4, 2
  q, k, v = random_qkv(B=B, T=T, S=T, N=N, K=K)
  options = {"is_causal": case == "softmax_causal"}
  mask = None
  if case == "padding_mask":
    mask = padding_mask([20, 7, 1, 13, 20, 3], T)
  elif case == "shared_mask_bias_lse":
    mask = padding_mask([15], T)  # leading 1: one mask for every row
    options |= {"logit_bias_BTN": jax.random.normal(jax.random.key(5), (1, T, N)),
                "return_lse": True, "logit_softcap": 5.0}
  else:
    options |= {"normalizer": "sigmoid", "return_stats": True, "is_causal": True}

  def run(chunk):
    def loss(q, k, v):
      out = xla_attention.dot_product_attention(q, k, v, mask, batch_chunk=chunk, **options)
      z = out[0] if isinstance(out, tuple) else out
      return jnp.sum(z * jnp.cos(z)), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  (loss_whole, out_whole), grads_whole = run(None)
  (loss_chunk, out_chunk), grads_chunk = run(batch_chunk)
  assert jax.tree.structure(out_whole) == jax.tree.structure(out_chunk)
  for a, b in zip(jax.tree.leaves((out_whole, grads_whole)), jax.tree.leaves((out_chunk,
                                                                              grads_chunk))):
    assert a.shape == b.shape
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
  # The loss sums every output element in float32; chunking reorders that sum (2e-6
  # relative on an AVX-512 host), so the same 1e-5 as the elements.
  np.testing.assert_allclose(loss_chunk, loss_whole, rtol=1e-5)


def test_cpu_batch_chunk_fits_the_cache_bidirectional_on_one_cpu_device():
  from attnscale.core import fused as fused_lib
  # The small BERT's attention: [32, 4, 128, 128] float32 logits, 256 KiB a row.
  assert xla_attention.default_batch_chunk(32, 4, 128, 128) == 2
  assert xla_attention.default_batch_chunk(1, 8, 4096, 4096) == 1
  assert xla_attention.default_batch_chunk(8, 1, 8, 8) == 8  # all fits: one pass
  assert xla_attention._divisor_at_most(6, 4) == 3 and xla_attention._divisor_at_most(7, 2) == 1
  if jax.default_backend() == "cpu" and jax.device_count() == 1:
    assert fused_lib.cpu_batch_chunk((32, 128, 4, 32), (32, 128, 4, 32), False) == 2
    # Causal attention keeps its query blocks alone (measured slower in groups).
    assert fused_lib.cpu_batch_chunk((32, 128, 4, 32), (32, 128, 4, 32), True) is None
