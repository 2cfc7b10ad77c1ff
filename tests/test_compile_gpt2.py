"""configs/gpt2.py compiled for a TPU v5e-8 and 8 H100s without them (compile.py): the
small preset fits in bfloat16 with FSDP and names its kernel, the accumulated step's
FLOPs count every micro-batch, and --tokens prints the best-case training time.

Needs libtpu and the CUDA plugin (`pip install -e ".[tpu,cuda12-compile]"`, JAX 0.12);
skipped without them. The two full-size compiles take minutes each (marked slow).
"""

import json
import os
import subprocess
import sys

import pytest

from attnscale.runtime import aot
from attnscale.testing import check_fsdp_report, installed
from configs import gpt2

pytestmark = pytest.mark.accelerator
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_libtpu = pytest.mark.skipif(not installed("libtpu"),
                                  reason='no TPU compiler here: pip install -e ".[tpu]"')
needs_cuda = pytest.mark.skipif(not installed("jax_plugins.xla_cuda12"),
                                reason='no CUDA plugin here: pip install -e ".[cuda12-compile]"')


def _small():
  config = gpt2.get_config("preset=small")
  config.update_from_flattened_dict({"model.dtype": "bfloat16", "mesh.data": 1, "mesh.fsdp": 8})
  return config


@pytest.mark.slow
@pytest.mark.parametrize("target, kernel", [
    pytest.param("tpu-v5e-8", "splash", marks=needs_libtpu),
    pytest.param("gpu-h100x8", "cudnn", marks=needs_cuda)])
def test_gpt2_small_fits_with_fsdp(target, kernel):
  """GPT-2 small (configs/gpt2.py) at fsdp=8 fits, names its kernel, is FSDP (no
  activation moved, an eighth of every matrix a device: `check_fsdp_report`), and
  the accumulated step's FLOPs count every micro-batch. The one GPT-2 small compile
  per target: test_compile_tpu.py and test_compile_gpu.py leave it to this file."""
  config = _small()
  report = aot.compile_report(config, target)
  check_fsdp_report(report, config, kernel)
  flops = report["train_step"]["flops"]
  if flops["compiled_per_device"]:  # TPU: XLA's count, x the 8 micro-batches
    assert 0.5 < flops["compiled_per_device"] / flops["analytic_per_device"] < 1.1, flops


@needs_libtpu
def test_tokens_prints_the_best_case_time(tmp_path):
  out = tmp_path / "r.json"
  result = subprocess.run(
      [sys.executable, "compile.py", "--config=configs/gpt2.py:preset=test",
       "--target=tpu-v5e-8", "--config.mesh.fsdp=8", "--config.grad_accum_steps=1",
       "--tokens=1e6", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  t = report["training_time"]
  assert t["steps"] == -(-1_000_000 // (8 * 32)) and t["tokens_per_step"] == 256
  step_s = report["train_step"]["roofline"]["step_s_lower_bound"]
  assert t["seconds_lower_bound"] == pytest.approx(t["steps"] * step_s)
  line = [x for x in result.stdout.splitlines() if x.startswith("training 1e+06 tokens")]
  assert line and "tpu-v5e-8: >= " in line[0] and "a lower bound" in line[0], result.stdout
