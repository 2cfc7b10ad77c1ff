"""attnscale.core.splash_attention (JAX's Pallas splash attention, in interpret mode on CPU) against
a naive float32 softmax: values and gradients (q, k, v, sink) with causal and full masks,
grouped heads, padded lengths and head dims, key padding, soft-cap, sinks; no leaks from the
future or from padded keys; queries that see nothing; shard_map over a mesh; refusals."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings, splash_attention
from attnscale.testing import cpu_devices_env, random_qkv

# Interpret mode is slow: these run in the newest-JAX CI leg (.ci/run).
pytestmark = [pytest.mark.usefixtures("strict_rank_promotion"), pytest.mark.accelerator]

SINK_N = jnp.array([-1.0, 0.0, 0.5, 2.0])  # N = 4 heads, near the logits' scale (q is scaled)


def naive(q, k, v, is_causal, kv_mask=None, softcap=None, sink=None):
  """softmax(cap(q k^T)) v over the visible keys, float32, an optional sink in the
  denominator, heads grouped as n -> n // G; a query that sees no key gets 0."""
  B, T, N, _ = q.shape
  S, K = k.shape[1], k.shape[2]
  k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k)
  if softcap is not None:
    logits = softcap * jnp.tanh(logits / softcap)
  visible = jnp.ones((B, 1, T, S), bool)
  if is_causal:
    visible &= jnp.tril(jnp.ones((T, S), bool))[None, None]
  if kv_mask is not None:
    visible &= kv_mask[:, None, None, :]
  logits = jnp.where(visible, logits, -jnp.inf)
  shift = jnp.max(logits, axis=-1, keepdims=True)
  if sink is not None:
    shift = jnp.maximum(shift, sink[None, :, None, None])
  shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
  e = jnp.where(visible, jnp.exp(logits - shift), 0.0)
  denom = e.sum(axis=-1, keepdims=True)
  if sink is not None:
    denom = denom + jnp.exp(sink[None, :, None, None] - shift)
  p = e / jnp.where(denom > 0, denom, 1.0)
  return jnp.einsum("bnts,bsnh->btnh", p, v)


def sees_some_key(T, is_causal, kv_mask):
  """[B, T, 1, 1]: 1.0 where query i sees at least one key (the caller zeroes the rest)."""
  B, S = kv_mask.shape
  if is_causal:  # query i sees keys j <= min(i, S - 1)
    seen_BT = (jnp.cumsum(kv_mask, axis=1) > 0)[:, jnp.minimum(jnp.arange(T), S - 1)]
  else:
    seen_BT = jnp.broadcast_to(jnp.any(kv_mask, axis=1)[:, None], (B, T))
  return seen_BT[:, :, None, None].astype(jnp.float32)


def scaled_qkv(seed=0, B=2, T=256, S=256, N=4, K=2, H=64):
  """q, k, v with q already scaled by 1/sqrt(H) (as `attention` hands them over): logits
  of order 1, so soft-caps and sinks of order 1 matter."""
  q, k, v = random_qkv(seed, B=B, T=T, S=S, N=N, K=K, H=H)
  return q / np.sqrt(H), k, v


def splash(is_causal, kv_mask=None, softcap=None, zero_unseen=False, **kwargs):
  """(q, k, v, sink) -> splash output, as `attention` would use it."""
  def f(q, k, v, sink=None):
    z = splash_attention.dot_product_attention(
        q, k, v, is_causal=is_causal, kv_mask_BS=kv_mask, logit_softcap=softcap,
        sink_N=sink, interpret=True, **kwargs)
    return z * sees_some_key(q.shape[1], is_causal, kv_mask) if zero_unseen else z
  return f


def assert_values_and_grads_close(got_fn, want_fn, args, rtol=1e-5, atol=1e-5):
  """got_fn(*args) == want_fn(*args) and so are the gradients of <f(args), w> w.r.t. every arg."""
  w = jax.random.normal(jax.random.key(7), args[0].shape)  # a cotangent that sees every output

  def value_and_grads(f):
    return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) * w),
                                      argnums=tuple(range(len(args)))))(*args)

  np.testing.assert_allclose(jax.jit(got_fn)(*args), want_fn(*args), rtol=rtol, atol=atol)
  (got_v, got_g), (want_v, want_g) = value_and_grads(got_fn), value_and_grads(want_fn)
  np.testing.assert_allclose(got_v, want_v, rtol=rtol, atol=atol)
  for i, (got, want) in enumerate(zip(got_g, want_g)):
    assert np.all(np.isfinite(got)), f"gradient {i} is not finite"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"gradient {i}")


# MHA with no padding at all (no segment ids); grouped heads over 3 x 3 causal blocks of 128
# with the head dim padded 64 -> 128; one kv head, T != S, both lengths padded (the padded
# keys are invisible by segment ids alone); more queries than keys, causal (top-left: query
# i sees keys j <= i, so queries past S see every key, and no padded one).
@pytest.mark.parametrize("is_causal,K,H,T,S", [(False, 4, 128, 256, 256),
                                               (True, 2, 64, 384, 384),
                                               (False, 1, 32, 200, 300),
                                               (True, 2, 32, 300, 130)])
def test_matches_naive(is_causal, K, H, T, S):
  q, k, v = scaled_qkv(K=K, H=H, T=T, S=S)
  assert_values_and_grads_close(splash(is_causal), lambda q, k, v: naive(q, k, v, is_causal),
                                (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
def test_key_padding(is_causal):
  """Row 0 sees every key, row 1 a random 70% of them (key 0 always, so every query sees one)."""
  q, k, v = scaled_qkv(T=200, S=200)
  kv_mask = jnp.stack([jnp.ones(200, bool),
                       jax.random.bernoulli(jax.random.key(1), 0.7, (200,)).at[0].set(True)])
  assert_values_and_grads_close(splash(is_causal, kv_mask),
                                lambda q, k, v: naive(q, k, v, is_causal, kv_mask), (q, k, v))


@pytest.mark.parametrize("softcap,with_sink", [(2.0, False), (None, True), (2.0, True)],
                         ids=["softcap", "sink", "softcap_and_sink"])
def test_softcap_and_sink(softcap, with_sink):
  q, k, v = scaled_qkv()
  kv_mask = jnp.arange(256)[None, :] < jnp.array([[256], [150]])
  got = splash(True, kv_mask, softcap)
  want = lambda q, k, v, sink=None: naive(q, k, v, True, kv_mask, softcap, sink)
  args = (q, k, v, SINK_N) if with_sink else (q, k, v)
  assert_values_and_grads_close(got, want, args)


def test_agrees_with_attnscale_reference():
  """The contract with `attention`: its reference path with scale 1 ("none"), a
  [B, 1, 1, S] padding mask, soft-cap and a per-head sink gives the same output."""
  q, k, v = scaled_qkv(T=130, S=130)
  lengths = jnp.array([130, 77])
  kv_mask = jnp.arange(130)[None, :] < lengths[:, None]
  got = splash(True, kv_mask, 3.0)(q, k, v, SINK_N)
  want = attnscale.attention(q, k, v, scale_fn=scalings.get("none"), is_causal=True,
                             mask=kv_mask[:, None, None, :], logit_softcap=3.0, sink=SINK_N,
                             implementation="reference")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_no_future_leak():
  """Causal: changing keys and values from position 200 on changes no earlier output, and
  the earlier outputs' gradient reaches none of them (3 query blocks, one split at 200)."""
  q, k, v = scaled_qkv(T=384, S=384, K=1)
  f = jax.jit(splash(True))
  k2 = k.at[:, 200:].set(100.0)
  v2 = v.at[:, 200:].set(-7.0)
  np.testing.assert_array_equal(f(q, k2, v2)[:, :200], f(q, k, v)[:, :200])
  dk, dv = jax.jit(jax.grad(lambda k, v: jnp.sum(f(q, k, v)[:, :200]), argnums=(0, 1)))(k, v)
  assert not np.any(dk[:, 200:]) and not np.any(dv[:, 200:])
  assert np.any(dk[:, :200]) and np.any(dv[:, :200])


@pytest.mark.parametrize("is_causal", [False, True])
def test_padded_keys_do_not_leak(is_causal):
  """Keys and values behind the padding mask (and behind the length padding 200 -> 256)
  change no output and get no gradient."""
  q, k, v = scaled_qkv(T=200, S=200)
  kv_mask = jnp.arange(200)[None, :] < jnp.array([[200], [120]])
  f = jax.jit(splash(is_causal, kv_mask))
  hidden = ~kv_mask[:, :, None, None]
  k2, v2 = jnp.where(hidden, 50.0, k), jnp.where(hidden, 1e4, v)
  np.testing.assert_array_equal(f(q, k2, v2), f(q, k, v))
  dk, dv = jax.jit(jax.grad(lambda k, v: jnp.sum(f(q, k, v)), argnums=(0, 1)))(k, v)
  assert not np.any(dk[1, 120:]) and not np.any(dv[1, 120:])


@pytest.mark.parametrize("with_sink", [False, True])
def test_queries_that_see_no_key(with_sink):
  """Row 0 is left-padded (causal queries 0..9 see nothing), row 1 sees no key at all:
  never NaN; with a sink those queries get exactly 0; and once the caller zeroes them,
  values and gradients match the reference (which gives them 0)."""
  q, k, v = scaled_qkv(T=128, S=128)
  kv_mask = jnp.stack([jnp.arange(128) >= 10, jnp.zeros(128, bool)])
  args = (q, k, v, SINK_N) if with_sink else (q, k, v)
  raw = jax.jit(splash(True, kv_mask))(*args)
  assert np.all(np.isfinite(raw))
  if with_sink:
    assert not np.any(raw[0, :10]) and not np.any(raw[1])
  want = lambda q, k, v, sink=None: naive(q, k, v, True, kv_mask, sink=sink)
  assert_values_and_grads_close(splash(True, kv_mask, zero_unseen=True), want, args)


def test_bfloat16():
  q, k, v = (x.astype(jnp.bfloat16) for x in scaled_qkv(T=128, S=128))
  got = jax.jit(splash(True))(q, k, v)
  assert got.dtype == jnp.bfloat16
  want = naive(*(x.astype(jnp.float32) for x in (q, k, v)), True)
  np.testing.assert_allclose(got.astype(jnp.float32), want, atol=3e-2, rtol=3e-2)


def test_mesh_of_one_device_runs_shard_map():
  q, k, v = scaled_qkv(T=128, S=128)
  kv_mask = jnp.arange(128)[None, :] < jnp.array([[128], [90]])
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
  assert_values_and_grads_close(splash(True, kv_mask, 3.0, mesh=mesh),
                                splash(True, kv_mask, 3.0), (q, k, v, SINK_N), rtol=1e-6, atol=1e-6)


def test_mesh_and_input_errors():
  q, k, v = scaled_qkv(T=128, S=128)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  with pytest.raises(ValueError, match="not axes of the mesh"):
    splash(False, mesh=mesh)(q, k, v)
  with pytest.raises(ValueError, match="kv_mask_BS must be boolean"):
    splash(False, jnp.ones((2, 1, 1, 128), bool))(q, k, v)
  with pytest.raises(ValueError, match="sink_N must have shape"):
    splash(False)(q, k, v, jnp.zeros(2))
  k3 = jnp.concatenate([k, k[:, :, :1]], axis=2)  # 3 kv heads for 4 query heads
  with pytest.raises(ValueError, match="cannot run this call"):
    splash(False)(q, k3, k3)


_TWO_DEVICES = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from attnscale.core import splash_attention
    from attnscale.testing import random_qkv
    assert jax.device_count() == 2
    q, k, v = random_qkv(B=4, T=128, S=128, N=4, K=2, H=32)
    mask = jnp.arange(128)[None, :] < jnp.array([[128], [60], [100], [1]])
    sink = jnp.array([-1.0, 0.0, 0.5, 2.0])
    w = jax.random.normal(jax.random.key(7), q.shape)
    def loss(mesh):
      f = lambda q, k, v, s: jnp.sum(w * splash_attention.dot_product_attention(
          q, k, v, is_causal=True, kv_mask_BS=mask, sink_N=s, mesh=mesh, interpret=True))
      return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(q, k, v, sink)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 1), ("data", "fsdp"))
    (got, got_g), (want, want_g) = loss(mesh), loss(None)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(got_g, want_g):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    print("OK")
    """)


def test_mesh_of_two_devices_shards_the_batch():
  """shard_map over 2 fake CPU devices: the same values and gradients, the replicated
  sink's gradient summed over both batch shards."""
  result = subprocess.run([sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True,
                          env=cpu_devices_env(2), timeout=300)
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_unsupported_reason():
  reason = splash_attention.unsupported_reason
  q, k = (2, 100, 8, 64), (2, 300, 2, 64)
  assert reason(q, k, normalizer="softmax", has_custom_mask=False) is None
  assert "softmax" in reason(q, k, normalizer="sigmoid", has_custom_mask=False)
  assert "mask" in reason(q, k, normalizer="softmax", has_custom_mask=True)
  assert "divide" in reason(q, (2, 300, 3, 64), normalizer="softmax", has_custom_mask=False)
  assert "empty" in reason((2, 0, 8, 64), k, normalizer="softmax", has_custom_mask=False)
  # Lengths and head dims are padded, never refused.
  assert reason((1, 7, 2, 200), (1, 1000, 1, 200), normalizer="softmax",
                has_custom_mask=False) is None


@pytest.mark.parametrize("n,want", [(1, (128, 128)), (128, (128, 128)), (200, (256, 256)),
                                    (384, (384, 128)), (640, (640, 128)), (1024, (1024, 512)),
                                    (1500, (1536, 512))])
def test_padded_length_and_block(n, want):
  assert splash_attention.padded_length_and_block(n) == want
