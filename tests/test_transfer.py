"""The transfer study's code: mup for the normalised attentions, u-muP for
the unit model, Muon (config.optimizer=muon), packed Muon."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attnscale import testing
from attnscale.config import labels, schema
from attnscale.models import ModelConfig, mup
from attnscale.runtime import configlib, optimizers, packed, packing, train_lib
from attnscale.runtime import train_state as ts
from tests.test_mup import SMALL, losses, make_config

UMUP = {"model.parameterization": "umup", "model.scaling": "umup",
        "model.unit.attn_residual": "rule"}

# unit_scaling 0.3.5's `lr_scale_func_adam` for the unit model's parameters at the test
# preset (L = 2, D = 32, F = 128, V = 65), each tagged as its `_modules.py` tags it,
# in torch's layout. Recorded once (no torch needed: the script runs the library's own
# three functions from the wheel's source):
#   pip download unit-scaling==0.3.5 --no-deps -d /tmp/us
#   python benchmarks/umup_library_lr.py /tmp/us/unit_scaling-0.3.5-py3-none-any.whl
LIBRARY_UMUP_LR = {
    "w_q": 0.12500000000000003,
    "w_up": 0.12500000000000003,
    "w_down": 0.06250000000000001,
    "ln1.scale": 0.7071067811865476,
    "embed": 0.1767766952966369,
    "pos_embed": 0.1767766952966369,
    "ln_f.scale": 1,
    "readout": 1,
}


def test_umup_lr_multipliers_equal_the_library(tfds_dir):
  config = make_config(tfds_dir, "preset=test,scaling=unit_scaled", **UMUP)
  cfg = schema.model_config(config)
  params = ts.state_shapes(config)["params"]
  mults = {ts._dotted(path): m for path, m in jax.tree_util.tree_leaves_with_path(
      mup.lr_multipliers(cfg, params))}
  for name, want in LIBRARY_UMUP_LR.items():
    got = mults[f"blocks.0.attn.{name}" if name == "w_q" else
                f"blocks.0.mlp.{name}" if name.startswith("w_") else
                f"blocks.0.{name}" if name.startswith("ln1") else name]
    assert got == pytest.approx(want, rel=1e-12), name


def test_umup_readout_is_untied_and_muP(tfds_dir):
  config = make_config(tfds_dir, "preset=test,scaling=unit_scaled", **UMUP)
  params = ts.state_shapes(config)["params"]
  assert params["readout"].shape == (32, 65)
  assert "readout" not in ts.state_shapes(
      make_config(tfds_dir, "preset=test,scaling=unit_scaled"))["params"]


@pytest.mark.heavy
@pytest.mark.parametrize("scaling", ["qk_rmsnorm", "cosine", "qk_layernorm", "inverse_d"])
def test_mup_equals_sp_at_the_base_width(tfds_dir, scaling):
  # graphcore_cpu's width 64 is the default base_width: every mup factor is exactly 1.
  arg = f"preset=graphcore_cpu,scaling={scaling}"
  sp = losses(make_config(tfds_dir, arg, **SMALL), 4)
  assert losses(make_config(tfds_dir, arg, **SMALL, **{"model.parameterization": "mup"}),
                4) == sp


def test_mup_attention_rules():
  base = dict(width=128, num_heads=4, base_width=64, parameterization="mup")
  # d = 32, d_base = 16: a_attn sqrt(d_base)/d = 1/8 as a logit scale.
  for scaling in ("qk_rmsnorm", "qk_layernorm"):
    name, params = mup.attention_scaling(ModelConfig(scaling=scaling, **base))
    assert (name, params["mult"] * 32**-0.5) == (scaling, pytest.approx(1 / 8))
  assert mup.attention_scaling(ModelConfig(scaling="standard", **base)) == (
      "inverse_d", {"mult": 4.0})
  assert mup.attention_scaling(ModelConfig(scaling="inverse_d", **base))[1] == {"mult": 1.0}
  assert mup.attention_scaling(ModelConfig(scaling="cosine", **base)) == ("cosine", {})


@pytest.mark.parametrize("fields, reason", [
    ({"parameterization": "mup", "scaling": "key_norm_sum"}, "key norms"),
    ({"parameterization": "mup", "scaling": "key_norm_power"}, "key norms"),
    ({"parameterization": "mup", "scaling": "log_n"}, "no muP rule"),
    ({"parameterization": "mup", "scaling": "cosine", "mup_attn_mult": 2.0}, "mup_attn_mult=1"),
    ({"parameterization": "umup"}, "model.variant='unit'"),
    ({"parameterization": "umup", "variant": "unit", "scaling": "fully_scaled"},
     "model.scaling='umup'"),
])
def test_refusals_are_one_line(fields, reason):
  with pytest.raises(ValueError) as info:
    ModelConfig(**fields)
  message = str(info.value)
  assert "model.parameterization" in message and reason in message and "\n" not in message


def test_muon_refuses_mup_and_the_unit_model(tfds_dir):
  for arg, over in [("preset=test", {"model.parameterization": "mup"}),
                    ("preset=test,scaling=unit_scaled", {})]:
    config = make_config(tfds_dir, arg, optimizer="muon", **over)
    with pytest.raises(ValueError, match="config.optimizer='muon' needs") as info:
      configlib.validate(config)
    assert "\n" not in str(info.value)
  with pytest.raises(ValueError, match="config.muon_lr_rule"):
    configlib.validate(make_config(tfds_dir, "preset=test", optimizer="muon",
                                   muon_lr_rule="kimi"))


def newton_schulz(g, steps=5, coeffs=(3.4445, -4.7750, 2.0315)):
  """Jordan et al.'s quintic iteration in numpy (float64), from G / ||G||_F."""
  a, b, c = coeffs
  x = g / np.linalg.norm(g)
  wide = x.shape[0] <= x.shape[1]
  x = x if wide else x.T
  for _ in range(steps):
    A = x @ x.T
    x = a * x + (b * A + c * A @ A) @ x
  return x if wide else x.T


@pytest.mark.parametrize("rule, factor", [("moonlight", 0.2 * 8**0.5),
                                          ("modded_nanogpt", 2**0.5)])
def test_muon_one_step_is_its_definition(tfds_dir, rule, factor):
  """One step on a (4, 8) hidden matrix: -lr x factor x NS5(nesterov momentum), and
  the non-matrix leaves get Adam's first step, -lr sign(g)."""
  config = make_config(tfds_dir, "preset=test", optimizer="muon", muon_lr_rule=rule,
                       lr_schedule="constant", warmup_steps=0, grad_clip=0.0,
                       weight_decay=0.0)
  tx = optimizers.make_optimizer(config)
  rng = np.random.default_rng(0)
  params = {"blocks": [{"up": {"kernel": jnp.zeros((4, 8))}}], "embed": jnp.zeros((3, 4)),
            "scale": jnp.zeros((4,))}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  g = np.asarray(grads["blocks"][0]["up"]["kernel"], np.float64)
  beta = 0.95  # first step: bias-corrected Nesterov momentum is g (1 + 2 beta)/(1 + beta)
  want = -config.learning_rate * factor * newton_schulz(g * (1 + 2 * beta) / (1 + beta))
  np.testing.assert_allclose(updates["blocks"][0]["up"]["kernel"], want, rtol=2e-4,
                             atol=1e-7)
  for name in ("embed", "scale"):  # Adam's first step: lr g / (|g| + eps)
    np.testing.assert_allclose(updates[name], -config.learning_rate * np.sign(grads[name]),
                               rtol=1e-5)


def test_muon_matches_optax_contrib_on_wide_tall_and_square_matrices():
  """`optimizers.scale_by_muon` (the iteration without transposes) gives optax.contrib's
  updates and state over three steps, to float32 rounding, for every orientation."""
  rng = np.random.default_rng(0)
  params = {"square": jnp.zeros((8, 8)), "wide": jnp.zeros((4, 16)),
            "tall": jnp.zeros((16, 4))}
  ours = optimizers.scale_by_muon()
  theirs = optax.contrib.scale_by_muon(weight_dimension_numbers=lambda updates: jax.tree.map(
      lambda _: optax.contrib.MuonDimensionNumbers(), updates))
  state_ours, state_theirs = ours.init(params), theirs.init(params)
  for _ in range(3):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32),
                         params)
    up_ours, state_ours = ours.update(grads, state_ours)
    up_theirs, state_theirs = theirs.update(grads, state_theirs)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 (up_ours, state_ours), (up_theirs, state_theirs))


def test_muon_adam_lr_mult_scales_only_the_adam_branch(tfds_dir):
  """muon_adam_lr_mult = 0.25: the non-matrix leaves' first step is a quarter of
  Adam's, the hidden matrix's is Muon's as at 1; the label says so."""
  kwargs = dict(optimizer="muon", lr_schedule="constant", warmup_steps=0, grad_clip=0.0,
                weight_decay=0.0)
  rng = np.random.default_rng(0)
  params = {"blocks": [{"up": {"kernel": jnp.zeros((4, 8))}}], "embed": jnp.zeros((3, 4)),
            "scale": jnp.zeros((4,))}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  steps = {}
  for mult in (1.0, 0.25):
    config = make_config(tfds_dir, "preset=test", muon_adam_lr_mult=mult, **kwargs)
    configlib.validate(config)
    tx = optimizers.make_optimizer(config)
    steps[mult] = tx.update(grads, tx.init(params), params)[0]
  np.testing.assert_array_equal(steps[0.25]["blocks"][0]["up"]["kernel"],
                                steps[1.0]["blocks"][0]["up"]["kernel"])
  for name in ("embed", "scale"):
    np.testing.assert_allclose(steps[0.25][name], 0.25 * steps[1.0][name], rtol=1e-6)
  assert labels.run_label(make_config(tfds_dir, "preset=test", muon_adam_lr_mult=0.25,
                                         **kwargs)) == "standard+muon+adam_lr0.25"


def test_muon_adam_lr_base_width_is_adams_one_over_width(tfds_dir):
  """muon_adam_lr_base_width = 64 at width 32 (the test preset's): the non-matrix
  leaves' first step is twice Adam's (64 / 32), the hidden matrix's is Muon's."""
  kwargs = dict(optimizer="muon", lr_schedule="constant", warmup_steps=0, grad_clip=0.0,
                weight_decay=0.0)
  rng = np.random.default_rng(0)
  params = {"blocks": [{"up": {"kernel": jnp.zeros((4, 8))}}], "embed": jnp.zeros((3, 4))}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  steps = {}
  for base in (0, 64):
    config = make_config(tfds_dir, "preset=test", muon_adam_lr_base_width=base, **kwargs)
    configlib.validate(config)
    assert config.model.width == 32
    tx = optimizers.make_optimizer(config)
    steps[base] = tx.update(grads, tx.init(params), params)[0]
  np.testing.assert_array_equal(steps[64]["blocks"][0]["up"]["kernel"],
                                steps[0]["blocks"][0]["up"]["kernel"])
  np.testing.assert_allclose(steps[64]["embed"], 2 * steps[0]["embed"], rtol=1e-6)
  assert labels.run_label(make_config(tfds_dir, "preset=test", muon_adam_lr_base_width=64,
                                         **kwargs)) == "standard+muon+adam_per_width64"


@pytest.mark.parametrize("overrides, match", [
    ({"optimizer": "adamw", "muon_adam_lr_mult": 0.5}, "needs config.optimizer='muon'"),
    ({"optimizer": "adamw", "muon_adam_lr_base_width": 64}, "needs config.optimizer='muon'"),
    ({"optimizer": "muon", "muon_adam_lr_base_width": -1},
     "config.muon_adam_lr_base_width must be a width >= 0"),
    ({"optimizer": "muon", "muon_adam_lr_mult": 0.0}, "config.muon_adam_lr_mult must be > 0"),
])
def test_muon_adam_lr_mult_refusals_are_one_line(tfds_dir, overrides, match):
  with pytest.raises(ValueError, match=match) as info:
    configlib.validate(make_config(tfds_dir, "preset=test", **overrides))
  assert "\n" not in str(info.value)


@pytest.mark.heavy
@pytest.mark.parametrize("arg, overrides, label", [
    ("preset=test,scaling=qk_rmsnorm", {"model.parameterization": "mup"}, "qk_rmsnorm+mup"),
    ("preset=test,scaling=cosine", {"model.parameterization": "mup"}, "cosine+mup"),
    ("preset=test", {"optimizer": "muon"}, "standard+muon"),
    ("preset=test", {"optimizer": "muon", "qk_clip": 2.0}, "standard+qk_clip2+muon"),
    ("preset=test", {"optimizer": "muon", "muon_adam_lr_base_width": 64},
     "standard+muon+adam_per_width64"),
    ("preset=test,scaling=unit_scaled", UMUP | {"learning_rate": 0.5}, "unit/umup+umup"),
])
def test_trains_and_resumes(tfds_dir, tmp_path_factory, arg, overrides, label):
  overrides = overrides | {"lr_schedule": "constant", "warmup_steps": 0, "log_every": 1}
  config = make_config(tfds_dir, arg, **overrides)
  assert labels.run_label(config) == label
  full = testing.train_tiny_run(tmp_path_factory, config=config, name="full")
  assert full.metrics["loss"] < 4.1  # from ln 65 = 4.17
  stopped = make_config(tfds_dir, arg, num_train_steps=10, **overrides)
  half = testing.train_tiny_run(tmp_path_factory, config=stopped, name="half")
  resumed = train_lib.train_and_evaluate(make_config(tfds_dir, arg, **overrides),
                                         half.workdir)
  assert resumed["loss"] == full.metrics["loss"]
  a = testing.restore_checkpoint(config, full.workdir)
  b = testing.restore_checkpoint(config, half.workdir)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.heavy
def test_packed_muon_trains(tfds_dir, tmp_path):
  """Two Muon runs differing in learning rate and weight decay share one program."""
  configs = [make_config(tfds_dir, "preset=test", optimizer="muon", learning_rate=lr,
                         weight_decay=wd, num_train_steps=6, checkpoint_every=6,
                         eval_every=6)
             for lr, wd in ((3e-3, 0.1), (1e-2, 0.0))]
  packing.check_packable(configs)
  results = packed.train_packed(configs, [str(tmp_path / f"r{i}") for i in range(2)])
  assert [r["status"] for r in results] == ["done", "done"]
  assert all(np.isfinite(r["loss"]) for r in results)


def test_the_width_512_sweep_shares_width_32_with_the_transfer_sweep():
  """transfer_512's width-32 points are the transfer sweep's own (so on its workdir they
  are done and give the rate the transfer runs take), and its width-512 searches start
  at the extrapolated bests."""
  import math
  import os

  from attnscale.experiments import sweeps
  from configs import shakespeare_char_sweeps as sweep_configs
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  load = lambda name: sweeps.load_sweep(  # noqa: E731
      os.path.join(root, "configs/shakespeare_char.py"), name)
  big, transfer = load("transfer_512"), load("transfer")
  width = lambda p: dict(p.overrides)["model.width"]  # noqa: E731
  assert {width(p) for p in big} == {32, 512}
  assert {p.name for p in big if width(p) == 32} <= {p.name for p in transfer}
  sp = {round(-math.log2(dict(p.overrides)["learning_rate"])) for p in big
        if width(p) == 512 and p.arg.startswith("preset=graphcore_cpu,scaling=standard")
        and len(dict(p.overrides)) == 2}  # sp + Adam, standard: rate and width only
  assert sweep_configs.TRANSFER_START_512["sp_adam_standard"] in sp


def test_the_sensitivity_sweep_is_the_transfer_sweeps_searches():
  """transfer_sensitivity asks for the transfer sweep's own points (the same names) for
  its three labels, so on that workdir only the window seeds are new."""
  import os

  from attnscale.experiments import sweeps
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  load = lambda name: sweeps.load_sweep(  # noqa: E731
      os.path.join(root, "configs/shakespeare_char.py"), name)
  sensitivity, transfer = load("transfer_sensitivity"), load("transfer")
  assert {p.name for p in sensitivity} <= {p.name for p in transfer}
  assert {p.arg.split("scaling=")[1].split(",")[0] for p in sensitivity} == {
      "standard", "qk_rmsnorm", "cosine"}


def test_the_transfer_sweeps():
  """Every (label, width) of `transfer` searches, and every first-stage point of both
  sweeps validates (tests/test_sweep.py's test_every_sweep_point_builds_a_valid_config
  covers them too: it walks every name in SWEEPS)."""
  import os

  from attnscale.experiments import sweeps
  from configs import shakespeare_char
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # 13 labels: 11 of the design and the two controls (sp_adam_inverse_d,
  # sp_adam_unit_scaled).
  for name, widths, kinds in [("transfer", {32, 64, 128, 256}, 13), ("transfer_test", {16, 32}, 5)]:
    points = sweeps.load_sweep(os.path.join(root, "configs/shakespeare_char.py"), name)
    assert {dict(p.overrides)["model.width"] for p in points} == widths
    seen = set()
    for point in points:
      config = shakespeare_char.get_config(point.arg)
      config.update_from_flattened_dict(dict(point.overrides))
      configlib.validate(config)
      seen.add(labels.run_label(config))
    assert len(seen) == kinds, seen
