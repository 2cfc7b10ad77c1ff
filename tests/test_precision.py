"""Low precision: exact rounding to fp16/bf16/e4m3/e5m2, fp8 products rounded exactly where
documented, float32 untouched, and underflow that scale tracking reports."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from attnscale.models import ModelConfig, Transformer, UnitScaledTransformer
from attnscale.models import base as models_base
from attnscale.numerics import layers, precision, scale_tracking
from attnscale.numerics import unit_scaling as us

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

ML_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
             "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
def _values(seed, n, lo=-30, hi=18):
  """Float32 values whose magnitudes span 2^lo .. 2^hi, with both signs, zeros and
  exact midpoints between neighbouring e4m3 / e5m2 / fp16 values (the ties)."""
  rng = np.random.default_rng(seed)
  x = np.sign(rng.standard_normal(n)) * np.exp2(rng.uniform(lo, hi, n))
  ties = []
  for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
    v = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)))
    v = v[np.isfinite(v)]
    ties.append((v[1:] + v[:-1]) / 2)
  return np.concatenate([x, [0.0, -0.0], *ties, -ties[1]]).astype(np.float32)


def _draw(seed, shape, lo, hi):
  """Float32 values of magnitude 2^lo .. 2^hi (log-uniform), random signs."""
  rng = np.random.default_rng(seed)
  mag = np.exp2(rng.uniform(lo, hi, shape))
  return jnp.asarray(mag * rng.choice([-1.0, 1.0], shape), jnp.float32)


# ---------------------------------------------------------------------------
# Formats and rounding.


@pytest.mark.parametrize("name", list(precision.FORMATS))
def test_format_table_matches_ml_dtypes(name):
  fmt, info = precision.FORMATS[name], ml_dtypes.finfo(ML_DTYPES[name])
  assert fmt.max == float(info.max)
  assert fmt.min_normal == float(info.smallest_normal)
  assert fmt.min_subnormal == float(info.smallest_subnormal)
  assert jnp.dtype(fmt.dtype) == np.dtype(ML_DTYPES[name])


@pytest.mark.parametrize("name", list(precision.FORMATS))
def test_round_to_is_nearest_even_and_exact_where_representable(name):
  fmt, dtype = precision.FORMATS[name], ML_DTYPES[name]
  # Every value the format holds (all bit patterns of the 8-bit ones) passes unchanged.
  if name in ("e4m3", "e5m2"):
    held = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
  else:
    with np.errstate(over="ignore"):  # past fp16's max: inf, dropped below
      held = _values(1, 5000).astype(dtype).astype(np.float32)
  held = held[np.isfinite(held)]
  np.testing.assert_array_equal(precision.round_to(jnp.asarray(held), name), held)
  # Anything in range (ties included) rounds as ml_dtypes' round-to-nearest-even cast.
  x = _values(2, 20000)
  x = x[np.abs(x) <= fmt.max]
  want = x.astype(dtype).astype(np.float32)
  got = np.asarray(precision.round_to(jnp.asarray(x), name))
  np.testing.assert_array_equal(got, want)
  assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 stays -0.0
  # Underflow: at most half the smallest subnormal flushes (the tie goes to even 0).
  half = np.float32(fmt.min_subnormal / 2)
  np.testing.assert_array_equal(
      precision.round_to(jnp.asarray([half, np.nextafter(half, np.float32(1))]), name),
      [0.0, fmt.min_subnormal])


def test_round_to_overflow_as_each_format_defines():
  big = jnp.asarray([1e5, -1e5, 3e38, jnp.inf, -jnp.inf], jnp.float32)
  # fp16, bf16, e5m2 have inf: past max (and its half ulp) is inf, as ml_dtypes' cast.
  for name in ("float16", "e5m2"):
    got = np.asarray(precision.round_to(big, name))
    with np.errstate(over="ignore"):
      want = np.asarray(big).astype(ML_DTYPES[name]).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.all(np.isinf(got))
  assert np.isinf(precision.round_to(jnp.float32(3.4e38), "bfloat16"))
  np.testing.assert_array_equal(precision.round_to(jnp.float32(57344 + 2047), "e5m2"), 57344)
  # e4m3fn has no inf: ml_dtypes' (and XLA's) plain cast gives NaN, round_to saturates.
  assert np.isnan(np.float32(500).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
  np.testing.assert_array_equal(precision.round_to(big, "e4m3"), [448, -448, 448, 448, -448])
  assert np.isnan(precision.round_to(jnp.float32(jnp.nan), "e4m3"))


def test_per_tensor_scale_is_the_largest_power_of_two_in_range():
  for amax in (1e-6, 0.3, 1.0, 448.0, 449.0, 3e4):
    x = jnp.asarray([amax, -amax / 3, 0.0], jnp.float32)
    s = float(precision.per_tensor_scale(x, "e4m3"))
    assert s == 2.0**round(np.log2(s))
    assert 448 / 2 < amax * s <= 448
    assert scale_tracking._per_tensor_scale(amax, precision.FORMATS["e4m3"]) == s  # host copy
  assert float(precision.per_tensor_scale(jnp.zeros(3), "e5m2")) == 1.0
  rng = np.random.default_rng(3)  # far below e4m3's range: 2^-40 .. 2^-20
  x = jnp.asarray(np.exp2(rng.uniform(-40, -20, 1000)) * rng.choice([-1, 1], 1000), jnp.float32)
  s = precision.per_tensor_scale(x, "e4m3")
  np.testing.assert_array_equal(precision.quantise(x, "e4m3", "per_tensor"),
                                precision.round_to(x * s, "e4m3") / s)
  assert float(jnp.mean(precision.quantise(x, "e4m3") == 0)) > 0.99  # unscaled: all gone


# ---------------------------------------------------------------------------
# Where fp8 rounds: custom_vjp, one product, every product of both models.


def test_round_forward_and_backward_custom_vjp():
  x, g = _draw(4, (64,), -12, 6), _draw(5, (64,), -20, 0)
  y, pullback = jax.vjp(lambda x: precision.round_forward(x, "e4m3"), x)
  np.testing.assert_array_equal(y, precision.round_to(x, "e4m3"))
  np.testing.assert_array_equal(pullback(g)[0], g)  # straight-through
  y, pullback = jax.vjp(lambda x: precision.round_backward(x, "e5m2"), x)
  np.testing.assert_array_equal(y, x)
  np.testing.assert_array_equal(pullback(g)[0], precision.round_to(g, "e5m2"))
  # Under jit and grad too.
  grad = jax.jit(jax.grad(lambda x: jnp.sum(precision.round_backward(x, "e5m2") * g)))(x)
  np.testing.assert_array_equal(grad, precision.round_to(g, "e5m2"))


@pytest.mark.parametrize("scaling", ["none", "per_tensor"])
def test_fp8_matmul_rounds_inputs_forward_and_incoming_grad_backward(scaling):
  fp8 = precision.Fp8(scaling)
  q = functools.partial(precision.quantise, scaling=scaling)
  x, w, g = _draw(6, (3, 4, 8), -8, 4), _draw(7, (8, 5), -8, 2), _draw(8, (3, 4, 5), -22, -6)
  y, pullback = jax.vjp(lambda x, w: layers.matmul(x, w, fp8=fp8), x, w)
  xq, wq, gq = q(x, "e4m3"), q(w, "e4m3"), q(g, "e5m2")
  np.testing.assert_allclose(y, xq @ wq, rtol=1e-6)
  gx, gw = pullback(g)
  # dX = round(dY) round(W)^T and dW = round(X)^T round(dY), both left in float32.
  np.testing.assert_allclose(gx, gq @ wq.T, rtol=1e-6, atol=1e-30)
  np.testing.assert_allclose(gw, xq.reshape(-1, 8).T @ gq.reshape(-1, 5), rtol=1e-6,
                             atol=1e-30)
  assert gx.dtype == gw.dtype == jnp.float32
  assert not np.array_equal(gq, g) and not np.array_equal(xq, x)  # rounding did act
  # The unit-scaled ops round after their scales: linear's x after scale_bwd (forward
  # identity), the incoming gradient before the output scale's pass-through.
  y, pullback = jax.vjp(lambda x, w: us.linear(x, w, constraint=None, fp8=fp8), x, w)
  np.testing.assert_allclose(y, xq @ wq / np.sqrt(8), rtol=1e-6)
  np.testing.assert_allclose(pullback(g)[0], gq @ wq.T / np.sqrt(5), rtol=1e-6, atol=1e-30)


def _count_roundings(monkeypatch):
  counts = {"forward": 0, "backward": 0}

  def counting(which, fn):
    def wrapped(x, *args):
      counts[which] += 1
      return fn(x, *args)
    return wrapped

  monkeypatch.setattr(precision, "round_forward",
                      counting("forward", precision.round_forward))
  monkeypatch.setattr(precision, "round_backward",
                      counting("backward", precision.round_backward))
  return counts


def _tiny(cls, **kw):
  cfg = ModelConfig(vocab_size=40, block_size=16, num_layers=2, num_heads=2, width=32, **kw)
  return cls(cfg, rngs=nnx.Rngs(0))


def _loss(model, tokens):
  logits = model(tokens)
  return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])


def _tokens(batch):
  return jnp.asarray(np.random.default_rng(0).integers(0, 40, (batch, 16)), jnp.int32)


@functools.cache
def _report(variant, dtype, batch=4):
  """`scale_tracking.track` of a tiny model (shared by the tests: each costs a compile)."""
  cls, kw = VARIANTS[variant]
  tokens = _tokens(batch)
  return scale_tracking.track(_tiny(cls, dtype=dtype, **kw), lambda m: _loss(m, tokens))


UNIT = dict(variant="unit", scaling="umup")
VARIANTS = {"standard": (Transformer, {}), "unit": (UnitScaledTransformer, UNIT)}


@pytest.mark.parametrize("variant", [
    "standard", "unit"])
def test_fp8_rounds_every_product_and_qkv(variant, monkeypatch):
  counts = _count_roundings(monkeypatch)
  cls, kw = VARIANTS[variant]
  model = _tiny(cls, dtype="fp8", **kw)
  jax.eval_shape(lambda m: nnx.grad(_loss)(m, jnp.zeros((2, 16), jnp.int32)), model)
  # Per layer: q, k, v, out, up, down products (2 operands each) and q, k, v at the
  # kernel; plus the tied readout. Each product's gradient once.
  L, products = 2, 6 * 2 + 1
  assert counts == {"forward": 2 * products + 3 * L, "backward": products}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_other_dtypes_never_round(variant, dtype, monkeypatch):
  counts = _count_roundings(monkeypatch)
  cls, kw = VARIANTS[variant]
  jax.eval_shape(lambda m: nnx.grad(_loss)(m, jnp.zeros((2, 16), jnp.int32)),
                 _tiny(cls, dtype=dtype, **kw))
  assert counts == {"forward": 0, "backward": 0}


def _dense_before(self, inputs, out_sharding=None):  # layers.Dense before precision existed
  y_MO = nnx.Linear.__call__(self, inputs.reshape(-1, inputs.shape[-1]),
                             out_sharding=out_sharding)
  return y_MO.reshape(*inputs.shape[:-1], y_MO.shape[-1])


def _matmul_before(x_BxI, w_IxO, fp8=None, **kwargs):  # layers.matmul before precision
  assert fp8 is None
  y_MO = jnp.matmul(x_BxI.reshape(-1, x_BxI.shape[-1]), w_IxO, **kwargs)
  return y_MO.reshape(*x_BxI.shape[:-1], w_IxO.shape[-1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float32_and_bf16_programs_unchanged_by_precision_code(variant, dtype, monkeypatch):
  # The same jaxpr (so bitwise the same numbers) as with the layers as they were
  # before fp8 and taps: identity attention inputs, plain Dense and matmul.
  cls, kw = VARIANTS[variant]
  model = _tiny(cls, dtype=dtype, **kw)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 16)), jnp.int32)
  program = lambda: str(jax.make_jaxpr(lambda m: nnx.value_and_grad(_loss)(m, tokens))(model))
  now = program()
  monkeypatch.setattr(layers.Dense, "__call__", _dense_before)
  monkeypatch.setattr(layers, "matmul", _matmul_before)
  monkeypatch.setattr(models_base.precision, "attention_inputs", lambda cfg, q, k, v: (q, k, v))
  assert now == program()


def test_config_takes_float16_and_fp8():
  assert ModelConfig(dtype="float16").dtype == "float16"
  assert ModelConfig(dtype="fp8", fp8_scaling="per_tensor").fp8_scaling == "per_tensor"
  assert precision.fp8_of(ModelConfig(dtype="fp8")) == precision.Fp8("none")
  assert precision.fp8_of(ModelConfig(dtype="bfloat16")) is None
  with pytest.raises(ValueError, match=r"model.fp8_scaling must be one of \['none', 'per_tensor'\]"):
    ModelConfig(dtype="fp8", fp8_scaling="delayed")
  with pytest.raises(ValueError, match="model.dtype must be one of"):
    ModelConfig(dtype="float8")


# ---------------------------------------------------------------------------
# Scale tracking.


def test_tracking_records_named_tensors_and_their_gradients():
  model, tokens, report = _tiny(Transformer), _tokens(4), _report("standard", "float32")
  names = [t.name for t in report.tensors if t.direction == "forward"]
  assert names[:3] == ["blocks.0.attn.q_proj.x", "blocks.0.attn.q_proj.y",
                       "blocks.0.attn.k_proj.x"]
  assert {"blocks.1.attn.q", "blocks.1.mlp.down.y", "logits.y", "embed.embedding"} <= set(names)
  # Values: the logits and the gradient arriving at them, the weights' gradients.
  @nnx.jit
  def reference(model):
    logits = model(tokens)
    g_logits = jax.grad(lambda l: jnp.mean(jax.nn.logsumexp(l, -1) - l[..., 0]))(logits)
    loss, grads = nnx.value_and_grad(_loss)(model, tokens)
    return loss, logits, g_logits, grads["blocks"][0]["mlp"]["up"]["kernel"][...]

  loss, logits, g_logits, g_up = reference(model)
  np.testing.assert_allclose(report.get("logits.y").std, jnp.std(logits), rtol=1e-5)
  np.testing.assert_allclose(report.get("logits.y", "backward").std, jnp.std(g_logits),
                             rtol=1e-5)
  np.testing.assert_allclose(report.get("blocks.0.mlp.up.kernel", "backward").absmax,
                             jnp.max(jnp.abs(g_up)), rtol=1e-5)
  np.testing.assert_allclose(report.loss, loss, rtol=1e-6)
  # The unit model's products are named by the method that makes them, in order.
  unit = _report("unit", "float32")
  assert ["blocks.0.attn.qkv.x", "blocks.0.attn.qkv.y", "blocks.0.attn.qkv#1.x"] == [
      t.name for t in unit.tensors[:3]]
  assert unit.get("blocks.0.mlp#1.x").std == pytest.approx(1.0, abs=0.25)  # unit at init


def test_float16_underflow_without_loss_scaling_is_reported():
  # Many tokens in the mean loss make the standard model's gradients tiny (about
  # 2^-20 inside the blocks): fp16 flushes a large part of them to zero.
  report16 = _report("standard", "float16", batch=64)
  lost = {t.label: frac for t, what, frac in report16.flagged(0.05) if "zero in float16" in what}
  assert "blocks.0.attn.k_proj.x (grad)" in lost, report16.summary()
  assert max(lost.values()) > 0.3
  summary = "\n".join(report16.summary(0.05))
  assert "tensors lose more than 5% of their elements" in summary
  assert "blocks.0.attn.k_proj.x (grad)" in summary and "zero in float16" in summary
  # The float32 model (same parameters) predicts it: the same tensors' gradients
  # fall below fp16's half smallest subnormal, and float32 itself loses nothing.
  report32 = _report("standard", "float32", batch=64)
  predicted = report32.get("blocks.0.attn.k_proj.x", "backward").underflow["float16"]
  assert abs(predicted - lost["blocks.0.attn.k_proj.x (grad)"]) < 0.15
  assert report32.flagged() == [] and "no tracked tensor" in report32.summary()[0]


def test_scale_figure_and_precision_plot():
  pytest.importorskip("matplotlib")
  from attnscale.studies import precision as study
  reports = {dt: _report("unit", dt) for dt in ("float32", "fp8")}
  fig = study.plot_scales(reports, title="unit")
  assert len(fig.axes) == 2 and len(fig.axes[0].get_yticklabels()) == len(
      {t.name for t in reports["float32"].tensors})
  rows = [{"scaling": "standard", "dtype": d, "seed": 0, "final_train_loss": v}
          for d, v in (("float32", 1.5), ("fp8", float("nan")))]
  assert study.plot_precision(rows).axes
  rows += [{"scaling": "standard", "dtype": "float32", "seed": s, "final_train_loss": v}
           for s, v in ((1, 1.7), (2, 1.6))]
  # bfloat16 1.6, 2.0, 1.9: per-seed differences 0.1, 0.3, 0.3 -> paired +0.233 +-
  # t(0.975, 2) x 0.115 / sqrt(3) = 0.287: within noise on 3 seeds.
  rows += [{"scaling": "standard", "dtype": "bfloat16", "seed": s, "final_train_loss": v}
           for s, v in ((0, 1.6), (1, 2.0), (2, 1.9))]
  summary = {r["dtype"]: r for r in study.summary_table(rows)}
  assert summary["float32"]["final_train_loss"] == pytest.approx(1.6)
  assert summary["float32"]["half_range"] == pytest.approx(0.1)
  assert summary["fp8"]["diverged"] == 1 and math.isnan(summary["fp8"]["delta_vs_float32"])
  assert summary["fp8"]["vs_float32"] == "n=3+0: too few seeds"
  assert summary["bfloat16"]["vs_float32"] == "+0.233 [-0.054, +0.520] paired n=3: within noise"
  # The page's tables (precision_page.md): a format every seed of which diverged says so.
  page = study.page_tables(list(summary.values()), []).splitlines()
  assert page[2].startswith("| standard | 1.600 ± 0.100 | 1.833 ± 0.200 | - | diverged (1 of 1)")
  assert "| +0.233 [-0.054, +0.520]: noise | - | diverged (1 of 1) |" in page[6]
  lost = study.lost_fractions(reports["fp8"])
  assert 0 <= lost["grad_lost"] <= 1 and study.lost_fractions(reports["float32"])["grad_lost"] == 0
  # The unit model with its unit-scaled loss: forward and gradients near std 1
  # (gradients within 2^+-3; the plain mean loss would put them near 2^-12 here).
  summary = study.scale_summary(reports["float32"])
  assert abs(summary["fwd_median_log2_std"]) < 1 and abs(summary["grad_median_log2_std"]) < 3
  assert summary["grad_underflow_e5m2"] < 0.05 and math.isfinite(summary["dq_log2_std"])


def test_a_runs_scale_analysis_is_kept_and_read_back_without_weights(tmp_path):
  """`tracked` keeps a run's scale analysis in its directory (scales.json, archived
  with its records): an archived run, whose weights are gone, still gives its
  flushed fractions and scale summaries; a run with neither gives None."""
  import json

  from attnscale.experiments import run_records
  from attnscale.studies import precision as study
  assert "scales.json" in run_records.RECORDS
  run = tmp_path / "run"
  run.mkdir()
  assert study.tracked(str(run)) is None
  kept = {"step": 40, "grad_lost": 0.25, "fwd_lost": 0.0, "grad_underflow_float16": 0.1,
          "grad_underflow_e5m2": 0.5, "trained": {"dq_log2_std": -15.0},
          "init": {"dq_log2_std": -22.0}}
  (run / study.SCALES).write_text(json.dumps(kept))
  assert study.tracked(str(run)) == kept
