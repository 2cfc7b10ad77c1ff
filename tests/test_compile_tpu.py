"""Deviceless compilation for TPU (attnscale/runtime/aot.py, compile.py): the real train and
eval steps compiled by libtpu for a v5e-8 slice on this CPU machine, FSDP over all 8.

Checked on the compiled programs: splash attention, that they fit, per-device parameter
and optimizer bytes (the analytic count over fsdp), no all-to-all and no all-gathered
activation, every scaling's FLOPs and memory against standard's, Muon's Newton-Schulz
split over the chips, remat's saving, a
model too large for the chip reported as a row that says why, and a v5p-128 at fsdp=64
that gathers no activation. Needs libtpu (`pip install -e
".[tpu]"`, JAX 0.12); skipped without it. tests/test_compile_gpu.py does the H100s.
"""

import json
import os
import subprocess
import sys

import pytest

from attnscale.core import scalings
from attnscale.runtime import aot, aot_report, hlo
from attnscale.testing import (
  check_fsdp_report,
  compile_config,
  forget_and_differential_kernels,
  installed,
)

pytestmark = [pytest.mark.accelerator,
              pytest.mark.skipif(not installed("libtpu"),
                                 reason='no TPU compiler here: pip install -e ".[tpu]"')]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "tpu-v5e-8"


def test_compile_py_nanogpt(tmp_path):
  """The documented command (docs/guides/pods-and-gpus.md): r.json names the kernel,
  the bytes per device and fits."""
  out = tmp_path / "r.json"
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/shakespeare_char.py:preset=nanogpt",
       f"--target={TARGET}", "--config.model.dtype=bfloat16", "--config.mesh.fsdp=8",
       f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "attention kernel" in result.stdout and "splash" in result.stdout
  # libtpu's start-up banner on a machine that is not a TPU VM is not shown.
  for noise in ("E0000", "INVALID_ARGUMENT", "could not determine TPU", "InitGoogle"):
    assert noise not in result.stderr, result.stderr[-2000:]
  assert "8 chips of TPU v5e (1 TensorCore each), 16.00 GiB HBM each" in result.stdout
  report = json.loads(out.read_text())
  assert report["target"] == TARGET and report["mesh"] == {"data": 1, "fsdp": 8}
  check_fsdp_report(report, compile_config(), "splash")
  flops = report["train_step"]["flops"]
  # XLA's count (causal attention: about half of 12 L T D) against 6N + 12 L T D.
  assert 0.5 < flops["compiled_per_device"] / flops["analytic_per_device"] < 1.1


def test_compile_py_bert_base(tmp_path):
  """configs/bert_small.py's base preset (BERT-base: 12 x 768, seq 512, batch 256)
  as docs/guides/pods-and-gpus.md runs it: fits a v5e-8 with fsdp 8, splash."""
  out = tmp_path / "r.json"
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/bert_small.py:preset=base",
       f"--target={TARGET}", "--config.model.dtype=bfloat16", "--config.mesh.fsdp=8",
       f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  assert report["mesh"] == {"data": 1, "fsdp": 8}
  assert report["train_step"]["kernel"] == "splash" and report["train_step"]["memory"]["fits"]


def test_every_scaling_gets_splash_and_costs_about_what_standard_costs():
  """Every registered scaling (and the unit-scaled model) compiles with splash; each
  scaling's FLOPs are within 1.1x of standard's and its memory within 1.2x at the cpu
  preset (width 128, where the QK-norms' statistics weigh most: 1.16x; at nanogpt's
  width every scaling is within 1.1x, benchmarks/compile_targets.py --scalings)."""
  base = None
  for name in [*scalings.names(), "unit_scaled"]:
    if name != "unit_scaled" and hasattr(scalings.get(name), "logit_mod"):
      continue  # a per-pair logit transform (scale_invariant): the XLA kernel everywhere
    lowered, _ = aot.lower_steps(compile_config("cpu", name), TARGET)
    compiled = lowered["train_step"].compile()
    assert hlo.attention_kernel(compiled.as_text()) == "splash", name
    if name == "unit_scaled":  # another model, not a scaling: the kernel is the claim
      continue
    mem = compiled.memory_analysis()
    cost = (compiled.cost_analysis()["flops"],
            mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
            + mem.temp_size_in_bytes)
    base = base or cost
    assert cost[0] <= 1.1 * base[0], (name, cost[0] / base[0])
    assert cost[1] <= 1.2 * base[1], (name, cost[1] / base[1])


def test_remat_saves_activation_memory():
  temps = {}
  for remat in ("none", "full", "dots"):
    c = compile_config("test", batch_size=2048, remat=remat)  # activations dominate
    temps[remat] = aot.compile_report(c, TARGET)["train_step"]["memory"]["temporaries"]
  assert temps["full"] < 0.6 * temps["none"] and temps["dots"] < temps["none"], temps


def test_too_large_is_a_row_that_says_why(capfd):
  """XLA's compile-time out-of-memory is the row's reason, in the table (not only in
  the JSON), and its log line is not printed besides; compile.py then exits 1
  (tests/test_aot.py)."""
  c = compile_config("test", **{"model.num_layers": 2, "model.width": 24576,
                                "model.num_heads": 192})
  report = aot.compile_report(c, TARGET)
  memory = report["train_step"]["memory"]
  assert memory["fits"] is False and memory["over_by"] > 0 and report["fits"] is False, memory
  table = aot_report.format_report(report)
  assert "no (+" in table
  assert ("train_step does not fit (not compiled: the rows below fits are -): XLA's "
          "compile-time out-of-memory: CompileTimeHbmOom: Ran out of memory on HBM, the total "
          "memory required for HLO temporaries (") in table, table
  assert "RESOURCE_EXHAUSTED" not in capfd.readouterr().err


def test_fsdp_over_a_v5p_128_gathers_weights_not_activations():
  """64 chips (the name counts 128 cores), fsdp=64: no collective moves an
  activation. The TPU compiler gathers some weights in two stages, the first a
  bf16[32,6,384] (32 devices' shards of 6 rows) whose 32 is also the batch over 2
  devices; those are weights (hlo._staged_weight_gather)."""
  c = compile_config(**{"mesh.fsdp": 64})
  report = aot.compile_report(c, "tpu-v5p-128")
  assert report["num_devices"] == 64 and report["fits"]
  for step in ("train_step", "eval_step"):
    assert report[step]["activation_collectives"] == [], report[step]["activation_collectives"]
  assert report["train_step"]["collectives"]["all-gather"] > 0
  table = aot_report.format_report(report)
  assert ("target tpu-v5p-128: 64 chips of TPU v5p (2 TensorCores each, one JAX device: the "
          "name counts 128 cores), 95.00 GiB HBM each") in table
  assert "MiB" in table.splitlines()[4]  # the parameters per device: 0.66 MiB, not 0.00 GiB


def test_muon_partitions_its_newton_schulz_over_fsdp():
  """optimizer=muon on the v5e-8 at fsdp=8 (a width-256 test model): it compiles and
  fits, holds one moment for the hidden matrices (Adam's two elsewhere), and XLA
  splits the Newton-Schulz iteration (attnscale/runtime/optimizers.py) over the chips
  rather than repeating it on each: the step's FLOPs per device grow by about an
  eighth of the iteration's (1.5x that, measured 2026-11-28), far below the whole."""
  import jax

  from attnscale.runtime import optimizers
  from attnscale.runtime import train_state as ts
  reports = {}
  for opt in ("adamw", "muon"):
    c = compile_config("test", optimizer=opt, **{"model.width": 256, "model.num_heads": 4})
    reports[opt] = aot.compile_report(c, TARGET)["train_step"]
  assert reports["muon"]["memory"]["fits"]
  assert reports["muon"]["memory"]["optimizer_state"] < 0.6 * reports["adamw"]["memory"][
      "optimizer_state"]
  ns_flops = 0  # 5 steps of X X^T (2 i^2 o), A^2 (2 i^3), B X (2 i^2 o); i <= o
  for path, x in jax.tree_util.tree_flatten_with_path(ts.state_shapes(c)["params"])[0]:
    if optimizers.is_muon_matrix(path, x):
      i, o = sorted(x.shape)
      ns_flops += 5 * (4 * i * i * o + 2 * i**3)
  extra = (reports["muon"]["flops"]["compiled_per_device"]
           - reports["adamw"]["flops"]["compiled_per_device"])
  assert ns_flops / 8 < extra < ns_flops / 2, (extra, ns_flops)


def test_unknown_target_and_bad_mesh_are_one_line():
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/shakespeare_char.py:preset=test",
       "--target=tpu-v9"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith("error: --target must be one of")
  with pytest.raises(ValueError, match="config.mesh"):
    aot.compile_report(compile_config("test", **{"mesh.fsdp": 3}), "cpu")


NEW_NORMALIZERS = ("softpick", "relu", "stickbreaking")


def test_new_normalizers_compile_fsdp_on_the_xla_kernel():
  """model.normalizer softpick, relu and stick-breaking: the real train and eval steps
  at fsdp=8 fit, on attnscale's XLA kernel (splash and cuDNN have a softmax only),
  and move no activation that sigmoid's (the XLA kernel's) steps do not."""
  def report(normalizer):
    c = compile_config("test", **{"model.normalizer": normalizer})
    r = aot.compile_report(c, TARGET)
    for step in ("train_step", "eval_step"):
      assert r[step]["kernel"] == "xla" and r[step]["memory"]["fits"], (normalizer, step)
      assert r[step]["collectives"]["all-to-all"] == 0, (normalizer, step)
    return {step: sorted(r[step]["activation_collectives"]) for step in ("train_step",
                                                                          "eval_step")}
  base = report("sigmoid")
  for normalizer in NEW_NORMALIZERS:
    assert report(normalizer) == base, normalizer


def test_forget_gate_and_differential_attention_compile():
  """FoX's log forget gate (every normaliser takes it) and differential attention's
  two maps, forward and backward, batch-sharded over the 8 devices: the kernel
  call itself."""
  kernels = forget_and_differential_kernels(TARGET, ("softmax", *NEW_NORMALIZERS))
  assert kernels.pop("differential") == "splash"
  assert set(kernels.values()) == {"xla"}, kernels


def test_differential_model_compiles_with_splash():
  """`model.differential`'s whole train and eval steps at the test preset, fsdp over
  the 8 chips: splash (its values, 2 head dims wide, in two calls), fits, no all-to-all."""
  r = aot.compile_report(compile_config("test", **{"model.differential": True}), TARGET)
  for step in ("train_step", "eval_step"):
    assert r[step]["kernel"] == "splash" and r[step]["memory"]["fits"], step
    assert r[step]["collectives"]["all-to-all"] == 0, step


@pytest.mark.parametrize("overrides", [{"model.xsa": True}, {"model.head_norm": "rmsnorm"},
                                       {"model.xsa": True, "model.head_norm": "rmsnorm",
                                        "model.normalizer": "relu"}],
                         ids=["xsa", "head_norm", "xsa_head_norm_relu"])
def test_head_output_options_compile(overrides):
  """Exclusive self-attention and the per-head output RMSNorm (after the kernel, so
  softmax keeps splash; ReLU/L the XLA kernel): the whole train and eval steps at the
  test preset, fsdp over the 8 chips: fits, no all-to-all."""
  r = aot.compile_report(compile_config("test", **overrides), TARGET)
  kernel = "xla" if overrides.get("model.normalizer") == "relu" else "splash"
  for step in ("train_step", "eval_step"):
    assert r[step]["kernel"] == kernel and r[step]["memory"]["fits"], step
    assert r[step]["collectives"]["all-to-all"] == 0, step
