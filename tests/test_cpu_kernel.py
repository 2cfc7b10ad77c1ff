"""The native CPU flash-attention kernel (attnscale/core/cpu_kernel): values and gradients
equal the reference for each option it takes, float32 and bfloat16; no future or padding
leak; a prefix equals the full sequence; the same bits twice and on any number of threads;
memory O(T); the rule that picks it; the XLA kernel when the build fails.
(Every registered scaling on it: tests/test_attention.py and tests/test_kernel_options.py,
whose default kernel on a CPU it is.)"""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import cpu_kernel, fused, scalings
from attnscale.testing import padding_mask, random_qkv

pytestmark = [pytest.mark.usefixtures("strict_rank_promotion"),
              pytest.mark.skipif(jax.default_backend() != "cpu" or not cpu_kernel.available(),
                                 reason="the native CPU kernel did not build here")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# id: (B, T, S, N, K, H, V, causal, mask): tails (T, S not multiples of the 64-row
# tiles), one tile, several, T = 1, batch 1, grouped and multi-query heads, values
# twice as wide as q (differential attention's), key padding and a per-query mask.
SHAPES = {
    "causal_gqa": (2, 70, 70, 4, 2, 8, 8, True, None),
    "bidirectional_padded": (2, 37, 37, 4, 4, 16, 16, False, "padding"),
    "causal_padded_mqa": (2, 65, 65, 4, 1, 8, 8, True, "padding"),
    "cross_wide_values": (1, 9, 131, 2, 2, 8, 16, False, None),
    "per_query_mask": (1, 20, 20, 2, 1, 8, 8, True, "per_query"),
    "one_query": (1, 1, 1, 1, 1, 4, 4, True, None),
    "long_rows_short_keys": (1, 130, 3, 2, 2, 8, 8, True, None),
}
SINKS = {"none": None, "zero": 0.0, "per_head": "per_head"}


def _inputs(shape_id, dtype=jnp.float32, seed=0):
  B, T, S, N, K, H, V, causal, mask_kind = SHAPES[shape_id]
  kq, kk, kv, km = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(kq, (B, T, N, H), dtype)
  k = jax.random.normal(kk, (B, S, K, H), dtype)
  v = jax.random.normal(kv, (B, S, K, V), dtype)
  mask = None
  if mask_kind == "padding":  # row 0 sees every key, the others fewer; one row none
    lengths = [S] + [max(0, S - 7 * b) for b in range(1, B)]
    mask = padding_mask(lengths, S)
  elif mask_kind == "per_query":
    mask = jax.random.bernoulli(km, 0.7, (B, 1, T, S))
  return q, k, v, mask, causal


def _attend(impl, q, k, v, mask, causal, sink=None, name="standard"):
  if sink == "per_head":
    sink = jnp.linspace(-1.0, 1.5, q.shape[2])
  return attnscale.attention(q, k, v, scale_fn=scalings.get(name), mask=mask, is_causal=causal,
                             implementation=impl, sink=sink)


@pytest.mark.parametrize("sink", list(SINKS))
@pytest.mark.parametrize("shape_id", list(SHAPES))
def test_values_and_gradients_equal_the_reference(shape_id, sink):
  q, k, v, mask, causal = _inputs(shape_id)
  w = jax.random.normal(jax.random.key(7), q.shape[:3] + (v.shape[-1],))

  def loss(impl, q, k, v):
    out = _attend(impl, q, k, v, mask, causal, SINKS[sink])
    return jnp.sum(out * w), out

  results = {}
  for impl in ("reference", "native"):
    (_, out), grads = jax.jit(jax.value_and_grad(functools.partial(loss, impl),
                                                 argnums=(0, 1, 2), has_aux=True))(q, k, v)
    results[impl] = (out, *grads)
  for i, (got, want) in enumerate(zip(results["native"], results["reference"])):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1, np.abs(want).max()),
                               err_msg=f"output/gradient {i}")


@pytest.mark.parametrize("shape_id", ["causal_gqa", "bidirectional_padded"])
def test_bfloat16_close_to_the_float32_reference(shape_id):
  q, k, v, mask, causal = _inputs(shape_id)
  w = jax.random.normal(jax.random.key(7), q.shape)

  def loss(impl, dtype, q, k, v):
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out = _attend(impl, q, k, v, mask, causal, "per_head")
    return jnp.sum(out.astype(jnp.float32) * w), out

  want = jax.value_and_grad(functools.partial(loss, "reference", jnp.float32),
                            argnums=(0, 1, 2), has_aux=True)(q, k, v)
  got = jax.jit(jax.value_and_grad(functools.partial(loss, "native", jnp.bfloat16),
                                   argnums=(0, 1, 2), has_aux=True))(q, k, v)
  (_, out_w), grads_w = want
  (_, out_g), grads_g = got
  assert out_g.dtype == jnp.bfloat16
  # bf16 inputs and output (8 bits of mantissa), float32 inside: the XLA kernel's error.
  np.testing.assert_allclose(out_g.astype(jnp.float32), out_w, atol=3e-2)
  for g_got, g_want in zip(grads_g, grads_w):
    scale = float(np.abs(g_want).max())
    np.testing.assert_allclose(g_got.astype(jnp.float32), g_want, atol=3e-2 * scale)


def test_the_call_runs_the_native_kernel():
  q, k, v, mask, causal = _inputs("causal_padded_mqa")
  f = lambda q, k, v: _attend(None, q, k, v, mask, causal, 0.0).sum()
  text = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
  assert "attnscale_flash_fwd" in text and "attnscale_flash_bwd" in text


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_no_future_or_padding_leak_and_prefix_equals_full(causal):
  B, T, N, K, H = 2, 70, 4, 2, 8
  q, k, v = random_qkv(B=B, T=T, S=T, N=N, K=K, H=H)
  lengths = [T, 50]
  mask = padding_mask(lengths, T)
  attend = jax.jit(lambda q, k, v: _attend("native", q, k, v, mask, causal, "per_head"))
  full = np.asarray(attend(q, k, v))
  # Large padded keys and values change nothing, not even by rounding; nor their gradient.
  noise_k, noise_v = random_qkv(seed=1, B=B, T=T, S=T, N=N, K=K, H=H)[1:]
  out = np.asarray(attend(q, k.at[1, 50:].set(10 * noise_k[1, 50:]),
                          v.at[1, 50:].set(10 * noise_v[1, 50:])))
  np.testing.assert_array_equal(out, full)
  gk, gv = jax.grad(lambda k, v: attend(q, k, v).sum(), argnums=(0, 1))(k, v)
  assert np.all(np.asarray(gk[1, 50:]) == 0) and np.all(np.asarray(gv[1, 50:]) == 0)
  if not causal:
    return
  i = 66  # the second query block's middle: a prefix cut inside a tile
  f = lambda q, k, v: _attend("native", q, k, v, None, True, "per_head")
  full = np.asarray(f(q, k, v))
  prefix = np.asarray(f(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1]))
  np.testing.assert_allclose(full[:, :i + 1], prefix, rtol=1e-6, atol=1e-6)
  out = np.asarray(f(q, k.at[:, i + 1:].set(10 * noise_k[:, i + 1:]),
                     v.at[:, i + 1:].set(10 * noise_v[:, i + 1:])))
  np.testing.assert_array_equal(out[:, :i + 1], full[:, :i + 1])
  gk, gv = jax.grad(lambda k, v: f(q, k, v)[:, i].sum(), argnums=(0, 1))(k, v)
  assert np.all(np.asarray(gk[:, i + 1:]) == 0) and np.all(np.asarray(gv[:, i + 1:]) == 0)
  assert np.any(np.asarray(gv[:, :i + 1]) != 0)


def test_a_query_that_sees_no_key_gets_zeros():
  q, k, v = random_qkv(B=2, T=5, S=5)
  mask = padding_mask([5, 0], 5)
  for sink in (None, 0.0):
    out, grads = jax.value_and_grad(
        lambda q, k, v, sink=sink: _attend("native", q, k, v, mask, False, sink).sum(),
        argnums=(0, 1, 2))(q, k, v)
    z = _attend("native", q, k, v, mask, False, sink)
    assert np.all(np.asarray(z[1]) == 0) and np.all(np.isfinite(np.asarray(z)))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def _fwd_bwd_bits(q, k, v, mask):
  f = lambda q, k, v: _attend("native", q, k, v, mask, True, "per_head")
  w = jax.random.normal(jax.random.key(3), q.shape)
  # A fresh function: the environment is read when the call is traced.
  out, vjp = jax.vjp(jax.jit(lambda q, k, v: f(q, k, v)), q, k, v)
  return [np.asarray(x) for x in (out, *vjp(w))]


def test_same_bits_twice_and_on_any_number_of_threads(monkeypatch):
  q, k, v = random_qkv(B=3, T=130, S=130, N=4, K=2, H=16)
  mask = padding_mask([130, 100, 64], 130)
  want = _fwd_bwd_bits(q, k, v, mask)
  for pool, threads in (("xla", "0"), ("xla", "1"), ("own", "2"), ("own", "3")):
    monkeypatch.setenv("ATTNSCALE_NATIVE_POOL", pool)
    monkeypatch.setenv("ATTNSCALE_NATIVE_THREADS", threads)
    for got, w in zip(_fwd_bwd_bits(q, k, v, mask), want):
      np.testing.assert_array_equal(got, w, err_msg=f"pool {pool}, threads {threads}")


def test_memory_is_linear_in_the_length():
  # Forward and backward at T = 4096: XLA's temporaries hold no T x S buffer (64 MiB
  # in float32 per head); q, k, v, z, their gradients and lse are 6 MiB.
  B, T, N, H = 1, 4096, 2, 32
  q = jax.ShapeDtypeStruct((B, T, N, H), jnp.float32)
  f = lambda q, k, v: _attend("native", q, k, v, None, True).sum()
  compiled = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(q, q, q).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < T * T * 4 / 4


def test_the_rule_sends_what_the_kernel_does_not_take_to_xla():
  shape = (2, 16, 4, 8)
  rule = lambda impl="native", dtype=jnp.float32, normalizer="softmax", softcap=None, **kw: (
      fused.kernel_for(impl, shape, shape, dtype, None, normalizer, softcap, None, **kw))
  assert rule() == "native" and rule(None) == "native"  # the CPU default
  assert rule("xla") == "xla"  # today's kernel, by name
  assert rule(dtype=jnp.bfloat16) == "native"
  assert rule(dtype=jnp.float16) == "xla"
  assert rule(normalizer="sigmoid") == "xla" and rule(normalizer="softpick") == "xla"
  assert rule(softcap=30.0) == "xla"
  assert rule(return_stats=True) == "xla"
  assert rule(log_forget=True) == "xla" and rule(pair_bias=True) == "xla"
  assert rule(logit_mod=lambda l, i, j: l) == "xla"
  assert fused.native_refusal(jnp.float32, "softmax", None) is None
  assert "soft-cap" in fused.native_refusal(jnp.float32, "softmax", 30.0)


def test_model_config_names_the_kernel():
  from attnscale.models import ModelConfig
  from attnscale.models.base import attention_kernel
  assert attention_kernel(ModelConfig()) == "native"
  assert attention_kernel(ModelConfig(attention_impl="xla")) == "xla"
  assert attention_kernel(ModelConfig(logit_softcap=30.0)) == "xla"
  assert attention_kernel(ModelConfig(scaling="scale_invariant")) == "xla"
  with pytest.raises(ValueError, match="model.attention_impl must be one of"):
    ModelConfig(attention_impl="flash")


FALLBACK = """
import jax, jax.numpy as jnp, numpy as np
import attnscale
from attnscale.core import fused
from attnscale.testing import random_qkv
q, k, v = random_qkv()
got = [attnscale.attention(q, k, v, is_causal=True, implementation=i) for i in (None, "native")]
text = jax.jit(lambda q: attnscale.attention(q, k, v)).lower(q).compile().as_text()
want = attnscale.attention(q, k, v, is_causal=True, implementation="xla")
for g in got:
  np.testing.assert_array_equal(g, want)
assert "attnscale_flash" not in text
assert fused.kernel_for(None, q.shape, k.shape, q.dtype, None, "softmax", None, None) == "xla"
"""


@pytest.mark.parametrize("env", [{"CXX": "/bin/false"}, {"ATTNSCALE_NATIVE_KERNEL": "0"}],
                         ids=["build_fails", "switched_off"])
def test_fallback_to_the_xla_kernel(env, tmp_path):
  # An empty cache, so that the build runs (and fails) in the child.
  child_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": ROOT,
               "JAX_PLATFORMS": "cpu", **env}
  out = subprocess.run([sys.executable, "-c", FALLBACK], env=child_env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stderr.splitlines()
  said = [i for i, line in enumerate(lines) if "native CPU attention kernel" in line]
  if "CXX" in env:  # one warning line naming the cause, no source line after it
    assert len(said) == 1 and "/bin/false" in lines[said[0]], out.stderr
    assert said[0] + 1 == len(lines) or not lines[said[0] + 1].startswith(" "), out.stderr
  else:  # nothing when switched off
    assert said == [], out.stderr


BUILD = """
import sys
from attnscale.core.cpu_kernel import build
print(build.library_path())
"""


@pytest.mark.slow
def test_two_processes_building_at_once_share_one_library(tmp_path):
  # An empty cache, two first uses at once: one builds, the other waits on the lock
  # and loads the same file; no partial library is ever in place.
  env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": ROOT}
  procs = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  paths = {out.strip().splitlines()[-1] for out, _ in outs}
  assert len(paths) == 1
  folder = os.path.dirname(paths.pop())
  assert [f for f in os.listdir(folder) if f.endswith(".so")] and not [
      f for f in os.listdir(folder) if f.endswith(".tmp")]
