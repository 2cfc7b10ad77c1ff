"""The model's LayerNorm kernels (attnscale/numerics/layer_norm.py): the native C++
one and the fused-backward XLA one give flax's nn.LayerNorm's values and gradients
(x, scale, bias) for float32 and bfloat16, odd row counts and widths, batch 1; the
same bits twice and on any number of threads; under vmap (a pack of runs) one call
equal to each run alone; flax's LayerNorm when the build
fails; a model's training step on each equals flax's; the parameters are flax's;
the model config names the kernel (provenance.json's "layernorm_kernel")."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale.core import cpu_kernel
from attnscale.numerics import layer_norm

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")
native_only = pytest.mark.skipif(jax.default_backend() != "cpu" or not cpu_kernel.available(),
                                 reason="the native CPU kernel did not build here")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# id: (shape, bias): the cpu preset's rows, odd rows and widths (no full vector of 16,
# a tail after full vectors), more rows than a task of 128, batch 1, one row.
SHAPES = {"cpu_preset": ((32, 128, 128), False), "odd": ((5, 7, 33), True),
          "tasks_and_tail": ((3, 131, 130), True), "batch_1": ((1, 9, 24), False),
          "one_row": ((1, 1, 8), True), "rank_2": ((129, 64), True)}
# (x dtype, y dtype): float32; a bfloat16 model's (float32 stream in, bfloat16 out);
# bfloat16 both ways.
DTYPES = {"f32": (jnp.float32, jnp.float32), "f32_to_bf16": (jnp.float32, jnp.bfloat16),
          "bf16": (jnp.bfloat16, jnp.bfloat16)}


def _layer(kernel, D, bias, dtype):
  ln = layer_norm.LayerNorm(D, use_bias=bias, dtype=dtype, implementation=kernel,
                            rngs=nnx.Rngs(0))
  ln.scale[...] = 1.0 + 0.5 * jax.random.normal(jax.random.key(3), (D,))
  if bias:
    ln.bias[...] = jax.random.normal(jax.random.key(4), (D,))
  return ln


def _fwd_bwd(kernel, shape, bias, x_dtype, y_dtype):
  """(y, dx, dscale, dbias or None) of a jitted vjp, for a fixed dy."""
  ln = _layer(kernel, shape[-1], bias, y_dtype)
  graph, params = nnx.split(ln)
  keys = jax.random.split(jax.random.key(0), 2)
  # An offset mean and a std far from 1: what a residual stream looks like.
  x = (jax.random.normal(keys[0], shape) * 3.0 + 1.5).astype(x_dtype)
  dy = jax.random.normal(keys[1], shape).astype(y_dtype)

  @jax.jit
  def f(params, x, dy):
    y, vjp = jax.vjp(lambda p, x: nnx.merge(graph, p)(x), params, x)
    dparams, dx = vjp(dy)
    return y, dx, dparams

  y, dx, dparams = f(params, x, dy)
  dbias = dparams["bias"][...] if bias else None
  return [None if a is None else np.asarray(a, np.float32)
          for a in (y, dx, dparams["scale"][...], dbias)]


def _assert_close(got, want, dtype, what):
  # float32: rounding; bfloat16: a few units in the last place of the output's dtype,
  # relative to the largest magnitude (flax and the kernels round at different points).
  tol = 2e-5 if dtype == jnp.float32 else 2e-2
  for name, g, w in zip(("y", "dx", "dscale", "dbias"), got, want):
    if w is None:
      continue
    scale = max(1.0, float(np.max(np.abs(w))))
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("kernel", ["native", "fused_xla"])
@pytest.mark.parametrize("dtypes", list(DTYPES))
@pytest.mark.parametrize("shape_id", list(SHAPES))
def test_values_and_gradients_equal_flax(kernel, dtypes, shape_id):
  if kernel == "native" and not cpu_kernel.available():
    pytest.skip("the native CPU kernel did not build here")
  shape, bias = SHAPES[shape_id]
  x_dtype, y_dtype = DTYPES[dtypes]
  want = _fwd_bwd("xla", shape, bias, x_dtype, y_dtype)
  got = _fwd_bwd(kernel, shape, bias, x_dtype, y_dtype)
  # The gradients' dtypes: x's for dx, the parameters' (float32) for scale and bias.
  _assert_close(got, want, y_dtype if x_dtype == jnp.float32 else jnp.bfloat16,
                f"{kernel} {shape_id} {dtypes}")


@native_only
def test_the_layer_runs_the_kernel_it_names():
  x = jnp.ones((4, 16))
  for kernel, calls in (("native", True), (None, True), ("fused_xla", False), ("xla", False)):
    ln = _layer(kernel, 16, False, jnp.float32)
    text = jax.jit(lambda x, ln=ln: ln(x)).lower(x).compile().as_text()
    assert ("attnscale_layer_norm" in text) == calls, kernel
  assert layer_norm.kernel_for(None, jnp.float16, jnp.float16) == "xla"
  with pytest.raises(ValueError, match="implementation must be one of"):
    layer_norm.LayerNorm(16, implementation="fast", rngs=nnx.Rngs(0))


def test_parameters_are_flax_s():
  for kernel in layer_norm.IMPLEMENTATIONS:
    ours = nnx.state(layer_norm.LayerNorm(8, implementation=kernel, rngs=nnx.Rngs(0)))
    flax_s = nnx.state(nnx.LayerNorm(8, rngs=nnx.Rngs(0)))
    assert jax.tree.structure(ours) == jax.tree.structure(flax_s)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(flax_s)):
      np.testing.assert_array_equal(a, b)


def _bits(shape):
  return _fwd_bwd("native", shape, True, jnp.float32, jnp.float32)


@native_only
def test_same_bits_twice_and_on_any_number_of_threads(monkeypatch):
  shape = (3, 300, 40)  # several tasks of 128 rows, so the ds/db partials are summed
  want = _bits(shape)
  for pool, threads in (("xla", "0"), ("xla", "1"), ("own", "2"), ("own", "3")):
    monkeypatch.setenv("ATTNSCALE_NATIVE_POOL", pool)
    monkeypatch.setenv("ATTNSCALE_NATIVE_THREADS", threads)
    for got, w in zip(_bits(shape), want):
      np.testing.assert_array_equal(got, w, err_msg=f"pool {pool}, threads {threads}")


@native_only
@pytest.mark.parametrize("kernel", ["native", "fused_xla"])
def test_vmap_over_a_pack_equals_each_run_alone(kernel):
  # A pack of 3 runs (`attnscale.runtime.packed`): each its own gain, bias, x and dy;
  # 200 rows each, so that a run's rows span two tasks of the native kernel.
  R, shape = 3, (2, 100, 24)
  keys = jax.random.split(jax.random.key(5), 4)
  x = jax.random.normal(keys[0], (R, *shape)) * 2.0 + 1.0
  dy = jax.random.normal(keys[1], (R, *shape))
  scale = 1.0 + jax.random.normal(keys[2], (R, 24))
  bias = jax.random.normal(keys[3], (R, 24))

  def forward(kernel, scale, bias, x):
    ln = layer_norm.LayerNorm(24, implementation=kernel, rngs=nnx.Rngs(0))
    ln.scale[...], ln.bias[...] = scale, bias
    return ln(x)

  def one(kernel, scale, bias, x, dy):
    y, vjp = jax.vjp(functools.partial(forward, kernel), scale, bias, x)
    return (y, *vjp(dy))

  packed = jax.jit(jax.vmap(functools.partial(one, kernel)))(scale, bias, x, dy)
  text = jax.jit(jax.vmap(functools.partial(one, kernel))).lower(scale, bias, x, dy).as_text()
  assert "while" not in text  # one call for the pack, not a loop over its runs
  flax_s = jax.jit(jax.vmap(functools.partial(one, "xla")))(scale, bias, x, dy)
  for r in range(R):
    alone = jax.jit(functools.partial(one, kernel))(scale[r], bias[r], x[r], dy[r])
    for name, p, a, w in zip(("y", "dscale", "dbias", "dx"), packed, alone, flax_s):
      np.testing.assert_allclose(p[r], a, rtol=1e-6, atol=1e-6, err_msg=f"run {r}: {name}")
      np.testing.assert_allclose(p[r], w[r], rtol=2e-5, atol=1e-4, err_msg=f"run {r}: {name}")
  # x batched, the gain shared: the gain's gradient sums over the pack.
  shared = lambda kernel: jax.grad(lambda s: jnp.sum(jax.vmap(
      lambda x: forward(kernel, s, bias[0], x))(x) * dy))(scale[0])
  g, g_flax = shared(kernel), shared("xla")
  np.testing.assert_allclose(g, g_flax, rtol=2e-5, atol=1e-4)


FALLBACK = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from attnscale.numerics import layer_norm
x = jax.random.normal(jax.random.key(0), (6, 24))
ln = layer_norm.LayerNorm(24, rngs=nnx.Rngs(0))
text = jax.jit(lambda x: ln(x)).lower(x).compile().as_text()
assert "attnscale_layer_norm" not in text
assert layer_norm.kernel_for(None, jnp.float32, jnp.float32) == "xla"
assert layer_norm.kernel_for("native", jnp.float32, jnp.float32) == "xla"
np.testing.assert_array_equal(ln(x), nnx.LayerNorm(24, rngs=nnx.Rngs(0))(x))
"""


@pytest.mark.parametrize("env", [{"CXX": "/bin/false"}, {"ATTNSCALE_NATIVE_KERNEL": "0"}],
                         ids=["build_fails", "switched_off"])
def test_fallback_to_flax_s_layer_norm(env, tmp_path):
  # An empty cache, so that the build runs (and fails) in the child.
  child_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": ROOT,
               "JAX_PLATFORMS": "cpu", **env}
  out = subprocess.run([sys.executable, "-c", FALLBACK], env=child_env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  said = [line for line in out.stderr.splitlines() if "LayerNorm are unavailable" in line]
  assert len(said) == ("CXX" in env), out.stderr  # one warning line when the build fails


def _train_step(kernel, dtype="float32"):
  from attnscale import tasks
  from attnscale.runtime import steps
  from attnscale.runtime import train_state as ts
  from configs import shakespeare_char
  config = shakespeare_char.get_config("preset=test")
  config.update_from_flattened_dict({"model.dropout": 0.0, "model.layernorm_impl": kernel,
                                     "model.dtype": dtype, "model.attention_impl": "xla"})
  mesh = ts.make_mesh(config)
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.task_class(config).without_data(config)
  step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
  tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, 65)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "weights": jnp.ones((8, 32), jnp.float32)}
  for _ in range(2):  # the second step's loss follows the first update
    state, metrics = step(state, batch)
  return jax.device_get((metrics, state["params"]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_training_step_equals_flax_s(dtype):
  want_metrics, want_params = _train_step("xla", dtype)
  kernels = ["fused_xla"] + (["native"] if cpu_kernel.available() else [])
  tol = 1e-5 if dtype == "float32" else 1e-3
  for kernel in kernels:
    metrics, params = _train_step(kernel, dtype)
    for key in ("loss", "grad_norm"):
      assert metrics[key] == pytest.approx(want_metrics[key], rel=tol), (kernel, key)
    # (Adam's first updates are the gradients' signs, so the parameters themselves
    # can differ by a step where a gradient is near 0: compared by the metrics.)
    assert jax.tree.structure(params) == jax.tree.structure(want_params)


def test_model_config_checks_and_names_the_kernel():
  from attnscale.models import ModelConfig
  from attnscale.models.base import layernorm_kernel
  assert ModelConfig().layernorm_impl is None
  assert layernorm_kernel(ModelConfig()) == ("native" if cpu_kernel.available() else "xla")
  assert layernorm_kernel(ModelConfig(layernorm_impl="xla")) == "xla"
  assert layernorm_kernel(ModelConfig(layernorm_impl="fused_xla")) == "fused_xla"
  assert layernorm_kernel(ModelConfig(dtype="float16")) == "xla"
  with pytest.raises(ValueError, match="model.layernorm_impl must be one of"):
    ModelConfig(layernorm_impl="apex")
