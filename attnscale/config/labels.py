"""A run's label when no sweep declared one: the attention setup, derived from the config.

A sweep declares each run's label in `config.label`, and `RunConfig.run_label`
reads it there; this is the name of a run started by hand
(its log line, eval.json's "scaling") and of runs made before sweeps declared them.
"""

from __future__ import annotations

import dataclasses

from attnscale.core import scalings


def _number(v) -> str:
  return f"{v:g}" if isinstance(v, (int, float)) else f"{v}"


def derived_label(run) -> str:
  """The scaling's registered name; Graphcore's experiment (fully scaled attention in
  the unit-scaled, residual-weighted transformer) is "unit_scaled", the config
  argument that selects it; each model option or training rule that changes attention
  is appended ("+qk_rmsnorm", "+sink_learned", "+qk_clip50", ...), and "+post_ln"
  for a post-LN block (BERT's), so a sweep's post-LN and pre-LN runs of one scaling
  are two labels.

  `run`: a `RunConfig`.
  """
  m = run.model
  label = m.scaling
  params = dict(m.scaling_params or {})
  if params:  # fixed parameters: cosine(temperature=10), key_norm_power(p=2)
    label += "(" + ",".join(f"{k}={_number(v)}" for k, v in sorted(params.items())) + ")"
  if m.variant != "standard":
    label = scalings.preset_of(dataclasses.asdict(m)) or f"unit/{m.scaling}"  # "unit_scaled": a preset's name
  options = [
      (m.ln_position == "post", "+post_ln"),
      (m.qk_norm != "none", f"+qk_{m.qk_norm}"),
      (m.shared_kv, "+shared_kv"),
      (bool(m.num_kv_heads) and m.num_kv_heads != m.num_heads, f"+kv_heads{m.num_kv_heads}"),
      (m.normalizer != "softmax", f"+{m.normalizer}"),
      (bool(m.logit_softcap), f"+softcap{m.logit_softcap:g}"),
      (m.sink != "none", f"+sink_{m.sink}"),
      (m.attn_gate != "none", f"+gate_{m.attn_gate}"),
      (m.forget_gate, "+fox"),
      (m.differential, "+diff"),
      (m.xsa, "+xsa"),
      (m.head_norm != "none", f"+head_norm_{m.head_norm}"),
      (m.selective, "+selective"),
      (m.parameterization != "sp", f"+{m.parameterization}"),
      (m.mup_output_mult != 1, f"+output_mult{m.mup_output_mult:g}"),
      (m.mup_attn_mult != 1, f"+attn_mult{m.mup_attn_mult:g}"),
      (m.mup_vector_lr != "constant", f"+vector_lr_{m.mup_vector_lr}"),
      (bool(m.depth_alpha), f"+depth_alpha{m.depth_alpha:g}"),
      (bool(run.qk_clip), f"+qk_clip{run.qk_clip:g}"),
      (bool(run.z_loss), f"+z_loss{run.z_loss:g}"),
  ]
  label += "".join(text for on, text in options if on)
  if run.optimizer == "muon":  # the optimizer decides what transfers across width
    rule = run.muon_lr_rule
    label += "+muon" + ("" if rule == "moonlight" else f"_{rule}")
    if run.muon_adam_lr_mult != 1:
      label += f"+adam_lr{run.muon_adam_lr_mult:g}"
    if run.muon_adam_lr_base_width:
      label += f"+adam_per_width{run.muon_adam_lr_base_width}"
  return label
