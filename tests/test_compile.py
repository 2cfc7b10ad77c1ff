"""Deviceless compilation (attnscale/aot.py, compile.py): the real train and eval steps
compiled for a TPU v5e-8 slice and 8 H100s on this CPU machine, with FSDP over all 8.

Checked on the compiled programs: the attention kernel (splash on TPU, cuDNN on GPU)
for every registered scaling, that they fit, per-device parameter and optimizer bytes
(the analytic count over fsdp), and that FSDP moves weights and gradients only: no
all-to-all, no all-gathered activation. Needs libtpu and the CUDA plugin
(`pip install -e ".[tpu,cuda12-compile]"`, JAX 0.12); skipped without them.
"""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from attnscale import aot, scalings
from configs import shakespeare_char

pytestmark = pytest.mark.accelerator


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


HAVE = {"tpu": _installed("libtpu"), "gpu": _installed("jax_plugins.xla_cuda12")}
TARGETS = {"tpu": "tpu-v5e-8", "gpu": "gpu-h100x8"}
KERNEL = {"tpu": "splash", "gpu": "cudnn"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def needs(platform):
  return pytest.mark.skipif(not HAVE[platform], reason=f"no {platform} compiler here: "
                            f"pip install -e \".[{'tpu' if platform == 'tpu' else 'cuda12-compile'}]\"")


def config(preset="nanogpt", scaling="standard", **fields):
  c = shakespeare_char.get_config(f"preset={preset},scaling={scaling}")
  c.model.dtype, c.mesh.data, c.mesh.fsdp = "bfloat16", 1, 8
  for key, value in fields.items():
    *path, last = key.split(".")
    node = c
    for p in path:
      node = node[p]
    node[last] = value
  return c


def _param_bytes(config, fsdp):
  from attnscale import train_state as ts
  shapes = ts.state_shapes(config)
  nbytes = lambda tree: sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
  return nbytes(shapes["params"]) / fsdp, shapes


def _check_fsdp(report, config):
  params_per_device, shapes = _param_bytes(config, 8)
  for step in ("train_step", "eval_step"):
    row = report[step]
    assert row["memory"]["fits"], row["memory"]
    assert row["kernel"] == KERNEL[report["platform"]], step
    assert row["collectives"]["all-to-all"] == 0, step
    assert row["activation_collectives"] == [], row["activation_collectives"][:3]
    # Every matrix is split 8 ways; vectors (gains) are replicated: within 1%.
    assert row["memory"]["parameters"] == pytest.approx(params_per_device, rel=0.01)
  # Adam's two moments mirror the parameters (plus a step count).
  assert report["train_step"]["memory"]["optimizer_state"] == pytest.approx(
      2 * params_per_device, rel=0.01)


@needs("tpu")
def test_compile_py_nanogpt_for_tpu(tmp_path):
  """The README's command: r.json names the kernel, the bytes per device and fits."""
  out = tmp_path / "r.json"
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/shakespeare_char.py:preset=nanogpt",
       "--target=tpu-v5e-8", "--config.model.dtype=bfloat16", "--config.mesh.fsdp=8",
       f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "attention kernel" in result.stdout and "splash" in result.stdout
  report = json.loads(out.read_text())
  assert report["target"] == "tpu-v5e-8" and report["mesh"] == {"data": 1, "fsdp": 8}
  _check_fsdp(report, config())
  flops = report["train_step"]["flops"]
  # XLA's count (causal attention: about half of 12 L T D) against 6N + 12 L T D.
  assert 0.5 < flops["compiled_per_device"] / flops["analytic_per_device"] < 1.1


@needs("gpu")
def test_nanogpt_for_h100s_is_fsdp_and_cudnn():
  fsdp = aot.compile_report(config(), "gpu-h100x8")
  _check_fsdp(fsdp, config())
  # FSDP holds no more temporaries per device than data parallelism (the
  # activations are the same rows; only the weights are gathered).
  data = aot.compile_report(config(**{"mesh.data": 8, "mesh.fsdp": 1}), "gpu-h100x8")
  assert (fsdp["train_step"]["memory"]["temporaries"]
          <= 1.05 * data["train_step"]["memory"]["temporaries"])


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_gpt2_small_fits_with_fsdp(platform):
  if not HAVE[platform]:
    pytest.skip(f"no {platform} compiler here")
  c = config(batch_size=8, seq_len=1024, **{
      "model.num_layers": 12, "model.num_heads": 12, "model.width": 768,
      "model.block_size": 1024, "model.vocab_size": 50257, "model.dropout": 0.0})
  report = aot.compile_report(c, TARGETS[platform])
  _check_fsdp(report, c)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_every_scaling_gets_the_fused_kernel(platform):
  """The kernel choice follows the target, not this CPU host, for every scaling:
  splash's Mosaic call on TPU, cuDNN's partitioned call on GPU (in the lowered
  program; compiling each is what the two tests above do for standard)."""
  if not HAVE[platform]:
    pytest.skip(f"no {platform} compiler here")
  marker = "splash_" if platform == "tpu" else "CustomSPMDPartitioning"
  for name in [*scalings.names(), "unit_scaled"]:
    lowered, _ = aot.lower_steps(config("test", name), TARGETS[platform])
    assert marker in lowered["train_step"].as_text(), name


@needs("tpu")
def test_scalings_cost_about_what_standard_costs():
  """Compiled FLOPs and memory per device within 1.1x of standard's (TPU, nanogpt)."""
  base = aot.compile_report(config(), "tpu-v5e-8")["train_step"]
  for name in ("key_norm_sum", "unit_scaled"):
    row = aot.compile_report(config(scaling=name), "tpu-v5e-8")["train_step"]
    assert row["kernel"] == "splash"
    assert row["flops"]["compiled_per_device"] <= 1.1 * base["flops"]["compiled_per_device"]
    assert row["memory"]["total"] <= 1.1 * base["memory"]["total"], name


@needs("tpu")
def test_too_large_is_a_row_not_a_crash():
  c = config(**{"model.num_layers": 48, "model.width": 6144, "model.num_heads": 48})
  report = aot.compile_report(c, "tpu-v5e-8")
  assert report["train_step"]["memory"]["fits"] is False
  assert report["train_step"]["memory"]["over_by"] > 0


def test_unknown_target_and_bad_mesh_are_one_line():
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/shakespeare_char.py:preset=test",
       "--target=tpu-v9"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith("error: --target must be one of")
  with pytest.raises(ValueError, match="config.mesh"):
    aot.compile_report(config("test", **{"mesh.fsdp": 3}), "cpu")


@needs("tpu")
def test_remat_saves_activation_memory():
  temps = {}
  for remat in ("none", "full", "dots"):
    c = config("test", batch_size=2048, remat=remat)  # activations dominate
    temps[remat] = aot.compile_report(c, "tpu-v5e-8")["train_step"]["memory"]["temporaries"]
  assert temps["full"] < 0.6 * temps["none"] and temps["dots"] < temps["none"], temps
