"""The fused path agrees with the reference for every scaling: values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import attnscale
from attnscale.core import scalings
from attnscale.testing import padding_mask, random_qkv, scaling_params

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

TOL = dict(rtol=1e-5, atol=1e-5)
SETTINGS = {  # id: (is_causal, use padding mask, kv_heads)
    "plain": (False, False, 4),
    "causal": (True, False, 4),
    "padded": (False, True, 4),
    "causal_padded_gqa": (True, True, 2),
    "mqa": (False, False, 1),
}


def _run(q, k, v, name, params, setting, implementation):
  is_causal, padded, _ = SETTINGS[setting]
  mask = padding_mask([q.shape[1], 5], k.shape[1]) if padded else None
  return attnscale.attention(q, k, v, scale_fn=scalings.get(name, **params), mask=mask,
                             is_causal=is_causal, implementation=implementation)


def test_standard_equals_jax_dot_product_attention():
  q, k, v = random_qkv(K=2)
  for is_causal in (False, True):
    want = jax.nn.dot_product_attention(q, k, v, is_causal=is_causal)
    for impl in (None, "reference"):
      got = attnscale.attention(q, k, v, is_causal=is_causal, implementation=impl)
      np.testing.assert_allclose(got, want, **TOL)


# Every fused kernel the CPU runs: None picks the native kernel where it built.
CPU_KERNELS = [pytest.param(None, id="default"), pytest.param("xla", id="xla")]


@pytest.mark.parametrize("implementation", CPU_KERNELS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name,params", scaling_params())
def test_reference_equals_fused(name, params, setting, implementation):
  q, k, v = random_qkv(K=SETTINGS[setting][2])

  def loss(impl, q, k, v):
    out = _run(q, k, v, name, params, setting, impl)
    # A fixed random cotangent, so gradients see every output element.
    w = jax.random.normal(jax.random.key(7), out.shape)
    return jnp.sum(out * w), out

  grads = {}
  for impl in ("reference", implementation):
    (_, out), g = jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1, 2),
                                     has_aux=True)(q, k, v)
    grads[impl] = (out, *g)
  for got, want in zip(grads[implementation], grads["reference"]):
    assert got.shape == want.shape
    # Relative to the largest entry: log_n_power's gradients reach 10, where float32's
    # reference itself is 1.3e-5 from float64's (both kernels 6e-6).
    np.testing.assert_allclose(got, want, rtol=TOL["rtol"],
                               atol=TOL["atol"] * max(1.0, float(np.abs(want).max())))


def test_cosine_temperature_gradient_agrees():
  q, k, v = random_qkv()

  def loss(impl, g):
    out = attnscale.attention(q, k, v, scale_fn=scalings.get("cosine", temperature=g),
                              is_causal=True, implementation=impl)
    return jnp.sum(out * jnp.cos(out))

  g0 = jnp.array([4.0, 5.0, 6.0, 7.0])  # one temperature per head
  want = jax.grad(functools.partial(loss, "reference"))(g0)
  got = jax.grad(functools.partial(loss, None))(g0)
  assert np.all(np.abs(want) > 1e-4)
  np.testing.assert_allclose(got, want, **TOL)
  # And under jit, where the temperature is traced.
  np.testing.assert_allclose(jax.jit(jax.grad(functools.partial(loss, None)))(g0), want, **TOL)


@pytest.mark.parametrize("implementation", ["reference", None])
@pytest.mark.parametrize("name,params", scaling_params())
def test_check_grads(name, params, implementation):
  with jax.enable_x64(True):
    # N = 4: log_n_per_head's s has one entry per head of random_qkv's default N.
    q, k, v = random_qkv(B=1, T=5, S=5, N=4, K=2, H=4, dtype=jnp.float64)
    mask = padding_mask([4], 5)
    f = lambda q, k, v: attnscale.attention(
        q, k, v, scale_fn=scalings.get(name, **params), mask=mask, is_causal=True,
        implementation=implementation)
    # XLA's fused kernel takes its softmax in float32 even for float64 inputs.
    tol = 1e-5 if implementation == "reference" else 2e-3
    check_grads(f, (q, k, v), order=1, modes=("rev",), atol=tol, rtol=tol)


def test_output_dtype_follows_q():
  q, k, v = random_qkv(dtype=jnp.bfloat16)
  for impl in (None, "reference"):
    out = attnscale.attention(q, k, v, scale_fn=scalings.get("key_norm_sum"),
                              implementation=impl)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape


def test_bf16_close_to_float32():
  q, k, v = random_qkv()
  want = attnscale.attention(q, k, v, scale_fn=scalings.get("fully_scaled"))
  got = attnscale.attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)),
                            scale_fn=scalings.get("fully_scaled"))
  np.testing.assert_allclose(got.astype(jnp.float32), want, atol=0.05)


def _compiled_text(implementation, dtype, name="standard", params=None):
  q, k, v = random_qkv(T=128, S=128, N=4, K=2, H=64, dtype=dtype)
  f = lambda q, k, v: attnscale.attention(q, k, v, scale_fn=scalings.get(name, **(params or {})),
                                          is_causal=True, implementation=implementation)
  return jax.jit(jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
                 ).lower(q, k, v).compile().as_text()


def test_fused_path_on_cpu_is_the_native_kernel():
  if jax.default_backend() != "cpu":
    pytest.skip("the CPU kernel choice")
  from attnscale.core import cpu_kernel
  for dtype in (jnp.float32, jnp.bfloat16):
    text = _compiled_text(None, dtype)
    assert "cudnn" not in text.lower()
    # Forward and backward on the native kernel where it built; never with "xla".
    assert (("attnscale_flash_fwd" in text and "attnscale_flash_bwd" in text)
            == cpu_kernel.available())
    assert "attnscale_flash" not in _compiled_text("xla", dtype)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs a GPU")
@pytest.mark.parametrize("name,params", scaling_params())
def test_fused_path_on_gpu_runs_cudnn_for_every_scaling(name, params):
  # Checked in the compiled program, forward and backward: not assumed.
  text = _compiled_text(None, jnp.bfloat16, name, params)
  assert "__cudnn$fmha" in text, f"{name}: no cuDNN fused attention in the compiled step"


@pytest.mark.parametrize("name,params", scaling_params())
def test_fully_masked_row_gives_zeros(name, params):
  q, k, v = random_qkv(B=1)
  mask = jnp.ones((1, 1, 12, 12), bool).at[..., 3, :].set(False)  # query 3 sees nothing
  for impl in (None, "reference"):
    f = lambda q, k, v, impl=impl: attnscale.attention(
        q, k, v, scale_fn=scalings.get(name, **params), mask=mask, implementation=impl)
    out = f(q, k, v)
    assert np.all(np.asarray(out[:, 3]) == 0)
    grads = jax.grad(lambda *a, f=f: f(*a).sum(), argnums=(0, 1, 2))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads)


def test_custom_mask_pattern_agrees():
  # A per-query pattern (sliding window) combined with causality.
  q, k, v = random_qkv()
  i, j = jnp.arange(12)[:, None], jnp.arange(12)[None, :]
  window = (i - j < 4)[None, None]
  for name in ("key_norm_sum", "fully_scaled"):
    f = scalings.get(name)
    ref = attnscale.attention(q, k, v, scale_fn=f, mask=window, is_causal=True,
                              implementation="reference")
    fused = attnscale.attention(q, k, v, scale_fn=f, mask=window, is_causal=True)
    np.testing.assert_allclose(fused, ref, **TOL)


def test_cross_attention_lengths():
  q, k, v = random_qkv(T=6, S=10)
  for causal in (False, True):
    for name in ("key_norm_mean", "fully_scaled"):
      f = scalings.get(name)
      ref = attnscale.attention(q, k, v, scale_fn=f, is_causal=causal, implementation="reference")
      np.testing.assert_allclose(attnscale.attention(q, k, v, scale_fn=f, is_causal=causal),
                                 ref, **TOL)


@pytest.mark.parametrize("implementation", [None, "xla", "reference"])
def test_sigmoid_normalizer(implementation):
  q, k, v = random_qkv(B=1, N=2, K=2)
  out = attnscale.attention(q, k, v, normalizer="sigmoid", is_causal=True,
                            implementation=implementation)
  # Written out for query 4 of head 0: p_j = sigmoid(q.k_j / sqrt(d) - log 5), j <= 4.
  logits = (k[0, :5, 0] @ q[0, 4, 0]) / np.sqrt(8) - np.log(5)
  want = jax.nn.sigmoid(logits) @ v[0, :5, 0]
  np.testing.assert_allclose(out[0, 4, 0], want, **TOL)


def test_sigmoid_has_no_cudnn_kernel():
  q, k, v = random_qkv(B=1, N=2, K=2)
  with pytest.raises(ValueError, match="normalizer='sigmoid' has no cuDNN kernel"):
    attnscale.attention(q, k, v, normalizer="sigmoid", implementation="cudnn")
