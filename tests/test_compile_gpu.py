"""Deviceless compilation for GPUs (attnscale/runtime/aot.py): the real train and eval steps
compiled by XLA's CUDA compiler for 8 H100s on this CPU machine (the CUDA plugin and a
GPU target config, attnscale/runtime/targets/h100_sxm.txtpb), FSDP over all 8.

cuDNN flash attention in the compiled program, fits, FSDP's bytes and collectives, no
more temporaries per device than data parallelism, every scaling lowered to cuDNN, a
program too large for one H100 reported as a row that says why.
Needs the CUDA plugin and cuDNN (`pip install -e ".[cuda12-compile]"`, JAX 0.12);
skipped without them. tests/test_compile_tpu.py does the TPU slice.
"""

import pytest

from attnscale.core import scalings
from attnscale.runtime import aot, aot_report, hlo
from attnscale.testing import (
  check_fsdp_report,
  compile_attention_grad,
  compile_config,
  forget_and_differential_kernels,
  installed,
)

pytestmark = [pytest.mark.accelerator,
              pytest.mark.skipif(not installed("jax_plugins.xla_cuda12"),
                                 reason='no GPU compiler here: pip install -e ".[cuda12-compile]"')]
TARGET = "gpu-h100x8"


def test_nanogpt_is_fsdp_and_cudnn():
  fsdp = aot.compile_report(compile_config(), TARGET)
  check_fsdp_report(fsdp, compile_config(), "cudnn")
  # FSDP holds no more temporaries per device than data parallelism (the same
  # rows of activations; only the weights are gathered).
  data = aot.compile_report(compile_config(**{"mesh.data": 8, "mesh.fsdp": 1}), TARGET)
  assert (fsdp["train_step"]["memory"]["temporaries"]
          <= 1.05 * data["train_step"]["memory"]["temporaries"])


def test_bert_padding_compiles_with_cudnn():
  """The masked LM's right padding reaches cuDNN as sequence lengths, at fsdp=8."""
  from configs import bert_small
  c = bert_small.get_config("preset=test")
  c.update_from_flattened_dict({"model.dtype": "bfloat16", "mesh.data": 1, "mesh.fsdp": 8})
  report = aot.compile_report(c, TARGET)
  assert report["train_step"]["kernel"] == "cudnn" and report["train_step"]["memory"]["fits"]


def test_bert_base_fits_with_cudnn():
  """configs/bert_small.py's base preset (BERT-base: 12 x 768, seq 512, batch 256)
  on 8 H100s with fsdp 8, as docs/guides/pods-and-gpus.md runs it."""
  from configs import bert_small
  c = bert_small.get_config("preset=base")
  c.update_from_flattened_dict({"model.dtype": "bfloat16", "mesh.data": 1, "mesh.fsdp": 8})
  report = aot.compile_report(c, TARGET)
  assert report["train_step"]["kernel"] == "cudnn" and report["train_step"]["memory"]["fits"]


def test_every_scaling_lowers_to_cudnn():
  """The kernel choice follows the target, not this CPU host, for every scaling:
  cuDNN's partitioned custom call in the lowered program (compiling each is what the
  tests above do for standard; plain softmax, no soft-cap or sink)."""
  for name in [*scalings.names(), "unit_scaled"]:
    if name != "unit_scaled" and hasattr(scalings.get(name), "logit_mod"):
      continue  # a per-pair logit transform (scale_invariant): the XLA kernel everywhere
    lowered, _ = aot.lower_steps(compile_config("test", name), TARGET)
    assert "CustomSPMDPartitioning" in lowered["train_step"].as_text(), name


def test_too_large_is_a_row_that_says_why_without_xla_s_error_lines(capfd):
  """A program larger than one H100: XLA compiles it, logging an 'error in the
  calculation' and a failed rematerialization, which the report's row says in
  its own words (compile.py then exits 1: tests/test_aot.py)."""
  c = compile_config("test", **{"model.num_layers": 2, "model.width": 24576,
                                "model.num_heads": 192, "mesh.fsdp": 1})
  report = aot.compile_report(c, "gpu-h100x1")
  assert report["fits"] is False and report["train_step"]["memory"]["over_by"] > 0
  assert ("train_step does not fit: XLA compiled it; its memory analysis exceeds the "
          "device's memory") in aot_report.format_report(report)
  err = capfd.readouterr().err
  assert "error in the calculation" not in err and "rematerialization" not in err, err


NEW_NORMALIZERS = ("softpick", "relu", "stickbreaking")


def test_new_normalizers_forget_gate_and_differential_attention_compile():
  """softpick, ReLU/L and stick-breaking (alone and with FoX's log forget gate) and
  differential attention's two maps (values 2 head dims wide, as the model's: two cuDNN
  calls), forward and backward, batch-sharded over the 8
  H100s. The attention call alone: the whole train and eval steps of each normaliser
  compile for a TPU slice (tests/test_compile_tpu.py), and a GPU compile of a whole
  model costs minutes of this leg's 15 on a 2-core host."""
  import attnscale
  q, kv = (8, 256, 8, 64), (8, 256, 4, 64)
  for normalizer in NEW_NORMALIZERS:
    plain = lambda q, k, v, normalizer=normalizer: attnscale.attention(
        q, k, v, is_causal=True, normalizer=normalizer)
    assert hlo.attention_kernel(compile_attention_grad(TARGET, plain, q, kv, kv)) == "xla"
  kernels = forget_and_differential_kernels(TARGET, ("softmax", *NEW_NORMALIZERS))
  assert kernels.pop("differential") == "cudnn"
  assert set(kernels.values()) == {"xla"}, kernels


@pytest.mark.parametrize("overrides", [{"model.xsa": True}, {"model.head_norm": "rmsnorm"}],
                         ids=["xsa", "head_norm"])
def test_head_output_options_compile(overrides):
  """Exclusive self-attention and the per-head output RMSNorm act after the kernel, so
  the whole train and eval steps at the test preset keep cuDNN, fit, FSDP over 8."""
  r = aot.compile_report(compile_config("test", **overrides), TARGET)
  for step in ("train_step", "eval_step"):
    assert r[step]["kernel"] == "cudnn" and r[step]["memory"]["fits"], step
