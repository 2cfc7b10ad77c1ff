"""compile.py's report without an accelerator (attnscale/runtime/aot.py): the `cpu`
target's exit status when a program does not fit, the table's units and devices,
and which collectives count as moving an activation. The TPU and GPU targets:
tests/test_compile_tpu.py, tests/test_compile_gpu.py (accelerator)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from attnscale.runtime import aot, aot_report, hlo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 14.5B parameters: 54 GiB of float32 weights, more than any CI machine's memory.
TOO_LARGE = ["--config=configs/shakespeare_char.py:preset=test", "--target=cpu",
             "--config.model.num_layers=2", "--config.model.width=24576",
             "--config.model.num_heads=192"]


def compile_py(*flags):
  return subprocess.run([sys.executable, "compile.py", *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_a_program_that_does_not_fit_exits_1_after_the_table_saying_why(tmp_path):
  out = tmp_path / "r.json"
  result = compile_py(*TOO_LARGE, f"--out={out}")
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  error = result.stderr.strip().splitlines()[-1]
  assert error.startswith("error: standard does not fit cpu: train_step needs "), error
  assert "(XLA compiled it; its memory analysis exceeds the device's memory)" in error
  assert error.endswith("(--norequire_fit to exit 0)")
  lines = result.stdout.splitlines()
  assert any(line.startswith("fits") and "no (+" in line for line in lines), result.stdout
  assert "train_step does not fit: XLA compiled it; its memory analysis exceeds the " \
      "device's memory" in lines
  report = json.loads(out.read_text())  # written before the exit
  assert report["fits"] is False and report["train_step"]["memory"]["fits"] is False

  # Tables that want every row: the same table, exit 0.
  every_row = compile_py(*TOO_LARGE, "--norequire_fit")
  assert every_row.returncode == 0, every_row.stderr[-3000:]
  assert every_row.stdout.splitlines() == lines[:-1]  # all but "wrote r.json"


def test_sizes_below_a_hundredth_of_a_gib_are_in_smaller_units():
  assert [aot_report.format_bytes(b) for b in (None, 0, 100, 2048, 0.66 * 2**20, 0.07 * 2**30,
                                        95 * 2**30)] == [
      "-", "0 B", "100 B", "2.00 KiB", "0.66 MiB", "0.07 GiB", "95.00 GiB"]


def test_devices_say_chips_and_the_cores_a_tpu_name_counts():
  def phrase(target, n, kind):
    t = aot.target(target)
    return aot_report.devices_phrase({"num_devices": n, "platform": t.platform, "device_kind": kind,
                               "chip": t.chip or kind, "cores_per_chip": t.cores_per_chip})
  assert phrase("tpu-v5p-128", 64, "TPU v5") == (
      "64 chips of TPU v5p (2 TensorCores each, one JAX device: the name counts 128 cores)")
  assert phrase("tpu-v5e-8", 8, "TPU v5 lite") == "8 chips of TPU v5e (1 TensorCore each)"
  assert phrase("tpu-v4-8", 4, "TPU v4") == (
      "4 chips of TPU v4 (2 TensorCores each, one JAX device: the name counts 8 cores)")
  assert phrase("gpu-h100x8", 8, "NVIDIA H100") == "8 GPUs (H100 SXM)"
  assert phrase("cpu", 1, "cpu") == "1 CPU device (cpu)"


# nanogpt's shapes: layers of 384 x 384 and 1536 x 384 (and 384 x 1536) matrices, a
# [256, 384] position table; batch 64 x 256 over 64 devices.
_PARAMS = {"proj": np.zeros((384, 384)), "down": np.zeros((1536, 384)),
           "up": np.zeros((384, 1536)), "pos": np.zeros((256, 384)), "g": np.zeros(384)}
_BATCH = {"inputs": jax.ShapeDtypeStruct((64, 256), np.int32)}


def _found(result_shape, kind="all-gather"):
  text = f"  %x.1 = {result_shape} {kind}(%y.1), replica_groups=[2,32]<=[64]"
  return hlo.activation_collectives(text, _PARAMS, _BATCH, 64, (6, 6, 64))


def test_a_weight_gathered_in_stages_is_not_an_activation():
  """tpu-v5p-128 at fsdp=64 gathers a 384-row matrix's 64 shards of 6 rows in two
  stages, the first to bf16[32,6,384] (32 devices' shards): 32 is also the batch
  over 2 devices, but these are weights. An activation with that leading axis,
  bf16[32,256,384] (32 rows of the batch, 256 tokens), still counts."""
  assert _found("bf16[32,6,384]") == []
  assert _found("bf16[32,256,384]") == ["all-gather bf16[32,256,384]"]
  assert _found("bf16[16384,384]") == ["all-gather bf16[16384,384]"]  # B T x D
  assert _found("bf16[384,384]") == []  # a whole weight
  assert _found("bf16[6,64,384]", "all-to-all") == ["all-to-all bf16[6,64,384]"]


def test_a_parameters_shard_is_not_an_activation():
  """A gradient reduce-scattered into FSDP shards is a weight's: the [256, 384]
  position table's into 64 shards of 4 rows (4 = the batch over 16 devices, a
  batch size too), GPT-2 small's on 8 H100s (f32[128,768] of [1024, 768]). An
  activation of a shard's size on another axis still counts."""
  assert _found("f32[4,384]", "reduce-scatter") == []
  assert _found("f32[48,384]", "reduce-scatter") == []  # 384 / 8 rows of proj
  assert _found("f32[4,256,384]", "reduce-scatter") == ["reduce-scatter f32[4,256,384]"]
