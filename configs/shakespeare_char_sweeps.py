r"""The sweeps of configs/shakespeare_char.py: data, each point an ordinary train.py run.

  python sweep.py --config=configs/shakespeare_char.py --sweep=NAME --workdir=DIR

sweep.py finds this file beside the config (`<config>_sweeps.py`:
attnscale/experiments/sweeps.py, `load_sweep`). `SWEEPS` maps each name to a
`Sweep` built by attnscale/experiments/sweep_builders.py; a new sweep is one entry.
Each study's page in docs/experiments/ says what its sweep measures, what it cost
and what it found. Learning rates are exponents e for 2^-e unless they are floats.
"""

from attnscale.experiments.sweep_builders import (
  Sweep,
  axis_search,
  grid,
  length,
  length_search,
  listed,
  precision,
  seeds_first,
  sensitivity,
  staged,
)

CONFIG = "shakespeare_char.py"  # the config file (next to this one) these sweeps run

# Points trained together in one vmapped program by default (sweep.py --pack=R
# overrides), by preset: docs/benchmarks.md, "Sweeps: runs per hour and packing".
PACK_BY_PRESET = {"graphcore_cpu": 8, "test": 4, "cpu": 2, "graphcore": 8}

# Learning-rate x scaling grids (docs/experiments/graphcore_cpu.md). The CPU grid is
# wider than Graphcore's: the unit-scaled model's and key_norm_sum's best rates sit
# far above the standard model's.
SWEEP_SCALINGS = ("standard", "fully_scaled", "unit_scaled", "key_norm_sum", "cosine")
# The grid's seed-0 bests, where the study protocol's search starts.
GRAPHCORE_CPU_LR_START = {"standard": 9, "fully_scaled": 10, "unit_scaled": 5,
                          "key_norm_sum": 5, "cosine": 9}

# Today's practice against the seeds' scalings (docs/experiments/practice.md): every
# registered scaling and attention option. Label -> (the argument's scaling, overrides);
# each label is the run's config.label, the study's row name (here and below: a
# scaling's name, its fixed parameters and options as the pages write them).
PRACTICE = {
    "standard": ("standard", {}),
    "none": ("none", {}),
    "key_norm_sum": ("key_norm_sum", {}),
    "key_norm_mean": ("key_norm_mean", {}),
    "key_norm_power(p=2)": ("key_norm_power", {}),
    "cosine": ("cosine", {}),  # learned temperature from g0 = log2(L^2 - L) = 12
    "cosine(temperature=12)": ("cosine,temperature=12", {}),
    "qk_layernorm": ("qk_layernorm", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "inverse_d": ("inverse_d", {}),
    "log_n": ("log_n", {}),
    "log_n_ratio": ("log_n_ratio", {}),
    "fully_scaled": ("fully_scaled", {}),
    "umup": ("umup", {}),
    "unit_scaled": ("unit_scaled", {}),
    "standard+softcap50": ("standard", {"model.logit_softcap": 50.0}),  # Gemma 2's cap
    "standard+sink_zero": ("standard", {"model.sink": "zero"}),
    "standard+sink_learned": ("standard", {"model.sink": "learned"}),
    "standard+gate_headwise": ("standard", {"model.attn_gate": "headwise"}),
    "standard+gate_elementwise": ("standard", {"model.attn_gate": "elementwise"}),
    "standard+sigmoid": ("standard", {"model.normalizer": "sigmoid"}),
}
# Starts: graphcore_cpu's best where it ran, else a guess from the logits' scale at
# init (smaller logits, larger rate); the search brackets wherever the best is.
PRACTICE_LR_START = dict.fromkeys(PRACTICE, 9) | {
    "key_norm_sum": 5, "key_norm_power(p=2)": 5, "unit_scaled": 5, "umup": 5,
    "fully_scaled": 10, "none": 10, "inverse_d": 8}
PRACTICE_LR_RANGE = (3, 12)  # the search never leaves 2^-3 ... 2^-12

# Shared keys and values (docs/experiments/shared_kv.md): W_K = W_V beside the same
# scalings with separate projections, and grouped-query attention with 2 key/value
# heads of 4, the parameter-matched control.
SHARED_KV = {}
for _name in ("standard", "cosine", "qk_rmsnorm", "key_norm_sum"):
  SHARED_KV[_name] = PRACTICE[_name]
  SHARED_KV[_name + "+shared_kv"] = (PRACTICE[_name][0], {"model.shared_kv": True})
SHARED_KV["standard+kv_heads2"] = ("standard", {"model.num_kv_heads": 2})
SHARED_KV_LR_START = {k: 4 if k.startswith("key_norm_sum") else 9 for k in SHARED_KV}
# The larger model (the cpu preset) at its own rate, standard scaling.
SHARED_KV_CPU = {"standard": ("standard", {}),
                 "standard+shared_kv": ("standard", {"model.shared_kv": True}),
                 "standard+kv_heads2": ("standard", {"model.num_kv_heads": 2})}

# The width study (docs/experiments/width.md): Graphcore's recipe at widths 32 ... 256.
WIDTHS = (32, 64, 128, 256)
WIDTH_LABELS = {  # "sp/...": the standard parameterisation with that attention
    "sp/standard": ("standard", {}),
    "sp/qk_rmsnorm": ("qk_rmsnorm", {}),
    "sp/inverse_d": ("inverse_d", {}),
    "mup": ("standard", {"model.parameterization": "mup"}),  # base width 64
    "unit_scaled": ("unit_scaled", {}),
    "sp/cosine": ("cosine", {}),
}
# Starts at width 64, one octave lower per doubling of width but for the labels that
# claim a rate that transfers.
WIDTH_START_64 = {"sp/standard": 9, "sp/qk_rmsnorm": 9, "sp/inverse_d": 8, "unit_scaled": 5,
                  "sp/cosine": 9, "mup": 9}
WIDTH_MOVES = ("sp/standard", "sp/qk_rmsnorm", "sp/inverse_d", "sp/cosine")
WIDTH_BOUNDS = (2, 15)  # the search never leaves 2^-2 ... 2^-15

# The depth variant (docs/experiments/width.md, "Depth"): 2, 4 and 8 layers at width
# 64, with and without the depth rule (model.depth_alpha, base depth 4).
DEPTHS = (2, 4, 8)
DEPTH_LABELS = {
    "sp/standard": ("standard", {}),
    "sp/standard+depth_alpha1": ("standard", {"model.depth_alpha": 1.0}),  # CompleteP's 1/L
    "sp/standard+depth_alpha0.5": ("standard", {"model.depth_alpha": 0.5}),  # depth-muP's
}

# The transfer study (docs/experiments/transfer.md): {sp + Adam, muP + Adam, sp + Muon}
# x attention, u-muP, sp + Muon + QK-clip, and two controls from the width study.
TRANSFER_ATTENTIONS = ("standard", "qk_rmsnorm", "cosine")
UMUP = {"model.parameterization": "umup", "model.scaling": "umup",
        "model.unit.attn_residual": "rule"}
TRANSFER_LABELS = {
    **{f"sp_adam_{a}": (a, {}) for a in TRANSFER_ATTENTIONS},
    **{f"mup_adam_{a}": (a, {"model.parameterization": "mup"}) for a in TRANSFER_ATTENTIONS},
    **{f"sp_muon_{a}": (a, {"optimizer": "muon"}) for a in TRANSFER_ATTENTIONS},
    "umup": ("unit_scaled", UMUP),
    "sp_muon_qk_clip": ("standard", {"optimizer": "muon", "qk_clip": 50.0}),
    "sp_adam_inverse_d": ("inverse_d", {}),  # muP's 1/d attention alone
    "sp_adam_unit_scaled": ("unit_scaled", {}),  # u-muP without its rate rules
}
# Starts at width 64; sp + Adam's move one octave per doubling of width.
TRANSFER_START_64 = dict.fromkeys(TRANSFER_LABELS, 9) | {"umup": 1, "sp_adam_inverse_d": 8,
                                                          "sp_adam_unit_scaled": 5}
TRANSFER_MOVES = tuple(label for label in TRANSFER_LABELS
                       if label.startswith("sp_adam") and label != "sp_adam_unit_scaled")
TRANSFER_BOUNDS = (-3, 15)  # 2^3 (u-muP's room) ... 2^-15
# Sensitivity with seeds at every window rate: Wortsman et al.'s comparison first.
TRANSFER_SENSITIVITY_LABELS = ("sp_adam_standard", "sp_adam_qk_rmsnorm", "sp_adam_cosine")
# Width 512, in the order to run them; starts extrapolated from each label's slope.
TRANSFER_512_LABELS = ("sp_adam_standard", "sp_adam_qk_rmsnorm", "mup_adam_standard", "umup",
                       "sp_muon_standard", "sp_muon_qk_clip")
TRANSFER_START_512 = {"sp_adam_standard": 12, "sp_adam_qk_rmsnorm": 13, "mup_adam_standard": 9,
                      "umup": 2, "sp_muon_standard": 11, "sp_muon_qk_clip": 11}
# muP's base multipliers, each alone (the other at 1), with standard attention: cosine
# refuses an attention multiplier (its temperature is learned).
MUP_MULT_VALUES = (0.25, 0.5, 2.0, 4.0)
MUP_MULT_LABELS = {"mup_adam_standard": TRANSFER_LABELS["mup_adam_standard"]} | {
    f"mup_adam_standard_{kind}{m:g}": ("standard", {"model.parameterization": "mup",
                                                    f"model.mup_{kind}_mult": m})
    for kind in ("output", "attn") for m in MUP_MULT_VALUES}
# The two multipliers that give sp's readout and logits at width 256, each at its
# width-32 best rate.
MUP_MULTS_256 = {"mup_adam_standard_output4": 9, "mup_adam_standard_attn2": 10}
# muP's forward pass with sp's best rate for every parameter at width 256 (an ablation).
MUP_VECTOR_LABEL = "mup_adam_standard_vector_lr_per_width"
MUP_VECTOR_LR_256 = ((9, (0, 1, 2)), (8, (0, 1, 2)), (10, (0,)), (7, (0,)))  # (e, seeds)
# Muon with its AdamW branch's rate falling as 1/width (muon_adam_lr_base_width).
MUON_ADAM_LABEL = "sp_muon_standard_adam_per_width64"
MUON_ADAM = {f"{MUON_ADAM_LABEL}@{w}": ("standard", {"optimizer": "muon", "model.width": w,
                                                     "muon_adam_lr_base_width": 64})
             for w in WIDTHS}

# The learning-rate sensitivity study (docs/experiments/sensitivity.md): each label up
# to 2^-SENSITIVITY_TOP, well past where the standard model diverges.
SENSITIVITY = {
    "standard": ("standard", {}),
    "qk_layernorm": ("qk_layernorm", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "cosine": ("cosine", {}),
    "standard+softcap50": ("standard", {"model.logit_softcap": 50.0}),
    "standard+qk_clip50": ("standard", {"qk_clip": 50.0}),  # the soft-cap's value
    "standard+sink_learned": ("standard", {"model.sink": "learned"}),
    "unit_scaled": ("unit_scaled", {}),
}
SENSITIVITY_BEST = dict.fromkeys(SENSITIVITY, 9) | {"unit_scaled": 5}  # practice's best e
SENSITIVITY_TOP = 2  # the largest rate: 2^-2

# The length study (docs/experiments/length.md): each scaling at its graphcore_cpu
# best; those that sweep did not cover at standard's.
LENGTH_LRS = {"standard": 2.0**-9, "log_n": 2.0**-9, "log_n_ratio": 2.0**-9,
              "key_norm_sum": 2.0**-5, "fully_scaled": 2.0**-10, "cosine": 2.0**-9,
              "qk_layernorm": 2.0**-9, "unit_scaled": 2.0**-5}
# The 2025 temperature scalings (keys are config arguments), every one at standard's rate.
LENGTH_2025_LRS = {"standard": 2.0**-9, "log_n": 2.0**-9, "temperature_tuning": 2.0**-9,
                   "yarn": 2.0**-9, "log_n,s=1": 2.0**-9, "log_n,s=2": 2.0**-9}
LENGTHS = "--lengths=64,128,256,512,1024"
# The critical-length comparison (docs/experiments/critical_length.md): each length
# law (the log law's exponents p; the power law's a, 2/(d-1) at graphcore_cpu's head
# dimension d = 16 and the simulation's sphere fit there) at gamma on a grid around 1,
# beside the length temperatures of practice, every one at standard's rate.
CRITICAL_LENGTH_LAWS = ("log_n_power,p=0.5", "log_n_power,p=1", "log_n_power,p=2",
                        "n_power,a=0.133", "n_power,a=0.232")
CRITICAL_LENGTH_GAMMAS = (0.5, 1, 2)
CRITICAL_LENGTH_BASELINES = ("standard", "log_n", "yarn", "scale_invariant")
CRITICAL_LENGTHS = "--lengths=64,128,256,512,1024,2048,4096"
CRITICAL_LENGTH_CHOOSE_AT = 512  # gamma's held-out length: the page reports 1024 ... 4096

# The normalisers study (docs/experiments/normalisers.md): softmax and its amendments
# (sinks, output gates), FoX's forget gate, differential and selective attention, and
# the non-softmax normalisers, each of those also with RMS QK-norm (softmax ignores a
# shift of the logits, they do not, so the scaling they need is part of the question).
# RoPE everywhere, so that every run is also evaluated at 64 ... 1024.
NORMALISER_OPTIONS = {
    "softmax": {},
    "sink_learned": {"model.sink": "learned"},
    "sink_zero": {"model.sink": "zero"},
    "gate_headwise": {"model.attn_gate": "headwise"},
    "gate_elementwise": {"model.attn_gate": "elementwise"},
    "fox": {"model.forget_gate": True},
    "differential": {"model.differential": True},
    "selective": {"model.selective": True},
}
NON_SOFTMAX = ("sigmoid", "softpick", "relu", "stickbreaking")
NORMALISERS = (
    {k: ("standard", v | {"model.positions": "rope"}) for k, v in NORMALISER_OPTIONS.items()}
    | {n: ("standard", {"model.normalizer": n, "model.positions": "rope"}) for n in NON_SOFTMAX}
    | {f"{n}_qk_rmsnorm": ("qk_rmsnorm", {"model.normalizer": n, "model.positions": "rope"})
       for n in NON_SOFTMAX})

# The precision study (docs/experiments/precision.md): every model.dtype with no loss
# scaling, and fp8 also with per-tensor scaling (the conventional baseline).
PRECISION_SCALINGS = ("standard", "fully_scaled", "cosine", "qk_layernorm", "key_norm_sum",
                      "unit_scaled")
PRECISION_FORMATS = {  # label -> field overrides (float32: none)
    "float32": {},
    "bfloat16": {"model.dtype": "bfloat16"},
    "float16": {"model.dtype": "float16"},
    "fp8": {"model.dtype": "fp8"},
    "fp8_per_tensor": {"model.dtype": "fp8", "model.fp8_scaling": "per_tensor"},
}

# The study protocol (docs/guides/sweeps.md): seeds 1 and 2 at every near-best rate.
PROTOCOL = {"more_seeds": (), "band_seeds": (1, 2)}
# The transfer study's search: the protocol, and seed 0 at every rate within two octaves
# of each best (the window its sensitivity averages over).
TRANSFER = {"bounds": TRANSFER_BOUNDS, "base": 64, "moves": TRANSFER_MOVES, "window": 2,
            **PROTOCOL}


def _pick(labels: dict, keys) -> dict:
  return {k: labels[k] for k in keys}


SWEEPS: dict[str, Sweep] = {
    # Graphcore's sweep at full size (a GPU job): Adam at a constant rate, 5000 steps.
    "graphcore": grid("graphcore", SWEEP_SCALINGS, [2.0**-e for e in range(7, 13)], (0,)),
    "graphcore_cpu": grid("graphcore_cpu", SWEEP_SCALINGS, [2.0**-e for e in range(3, 13)],
                          (0,)),
    "test": grid("test", ("standard", "fully_scaled"), [2.0**-8, 2.0**-6], (0,)),
    # The grid under the protocol: on graphcore_cpu's workdir it adds only the seeds.
    "graphcore_cpu_protocol": staged(
        "graphcore_cpu", {s: (s, {}) for s in SWEEP_SCALINGS}, GRAPHCORE_CPU_LR_START,
        bounds=(3, 12), window=9, **PROTOCOL),
    "practice": staged("graphcore_cpu", PRACTICE, PRACTICE_LR_START,
                       bounds=PRACTICE_LR_RANGE, **PROTOCOL),
    "practice_test": staged("test", _pick(PRACTICE, ("standard", "standard+sink_zero")),
                            {"standard": 7, "standard+sink_zero": 7}, bounds=PRACTICE_LR_RANGE,
                            more_seeds=(1,)),
    "shared_kv": staged("graphcore_cpu", SHARED_KV, SHARED_KV_LR_START,
                        bounds=PRACTICE_LR_RANGE, **PROTOCOL),
    "shared_kv_test": staged("test", _pick(SHARED_KV, ("standard", "standard+shared_kv")),
                             {"standard": 7, "standard+shared_kv": 7}, bounds=PRACTICE_LR_RANGE,
                             more_seeds=(1,)),
    "shared_kv_cpu": seeds_first("cpu", SHARED_KV_CPU, (0, 1, 2)),
    "width": axis_search("graphcore_cpu", WIDTH_LABELS, "model.width", WIDTHS, WIDTH_START_64,
                         bounds=WIDTH_BOUNDS, base=64, moves=WIDTH_MOVES, **PROTOCOL),
    "width_test": axis_search("test", _pick(WIDTH_LABELS, ("sp/standard", "mup")), "model.width",
                              (16, 32), WIDTH_START_64, bounds=WIDTH_BOUNDS, base=64,
                              moves=WIDTH_MOVES, more_seeds=(1,)),
    "transfer": axis_search("graphcore_cpu", TRANSFER_LABELS, "model.width", WIDTHS,
                            TRANSFER_START_64, **TRANSFER),
    # The searches again with seeds 1 and 2 at every window rate too (the same run
    # names: on the transfer sweep's workdir only those seeds are new).
    "transfer_sensitivity": axis_search(
        "graphcore_cpu", _pick(TRANSFER_LABELS, TRANSFER_SENSITIVITY_LABELS), "model.width",
        WIDTHS, TRANSFER_START_64, window_seeds=(1, 2), **TRANSFER),
    "transfer_sensitivity_all": axis_search(
        "graphcore_cpu", {k: v for k, v in TRANSFER_LABELS.items()
                          if k not in TRANSFER_SENSITIVITY_LABELS}, "model.width",
        WIDTHS, TRANSFER_START_64, window_seeds=(1, 2), **TRANSFER),
    # Its width-32 points are the transfer sweep's own (the same names).
    "transfer_512": axis_search(
        "graphcore_cpu", _pick(TRANSFER_LABELS, TRANSFER_512_LABELS), "model.width", (32, 512),
        TRANSFER_START_64, start_at=TRANSFER_START_512, **TRANSFER),
    "mup_mults": axis_search("graphcore_cpu", MUP_MULT_LABELS, "model.width", (32,),
                             dict.fromkeys(MUP_MULT_LABELS, 9), **TRANSFER),
    "mup_mults_256": listed("graphcore_cpu", [
        ("standard", MUP_MULT_LABELS[label][1] | {"learning_rate": 2.0**-e, "model.width": 256},
         (0, 1, 2), label) for label, e in MUP_MULTS_256.items()]),
    "mup_vector_lr_256": listed("graphcore_cpu", [
        ("standard", TRANSFER_LABELS["mup_adam_standard"][1] | {
            "model.mup_vector_lr": "per_width", "learning_rate": 2.0**-e, "model.width": 256},
         seeds, MUP_VECTOR_LABEL) for e, seeds in MUP_VECTOR_LR_256]),
    "muon_adam_width": staged(
        "graphcore_cpu", MUON_ADAM, {f"{MUON_ADAM_LABEL}@{w}": 7 + (w > 64) for w in WIDTHS},
        bounds=TRANSFER_BOUNDS, window=2, **PROTOCOL,
        transfer={f"{MUON_ADAM_LABEL}@{WIDTHS[0]}":
                  [f"{MUON_ADAM_LABEL}@{w}" for w in WIDTHS[1:]]},
        declared=dict.fromkeys(MUON_ADAM, MUON_ADAM_LABEL)),
    "transfer_test": axis_search(
        "test", _pick(TRANSFER_LABELS, ("sp_adam_standard", "mup_adam_qk_rmsnorm",
                                        "sp_muon_cosine", "umup", "sp_muon_qk_clip")),
        "model.width", (16, 32), dict.fromkeys(TRANSFER_LABELS, 7) | {"umup": 1}, **TRANSFER),
    "depth": axis_search("graphcore_cpu", DEPTH_LABELS, "model.num_layers", DEPTHS,
                         dict.fromkeys(DEPTH_LABELS, 9), tag="L", bounds=WIDTH_BOUNDS,
                         **PROTOCOL),
    "depth_test": axis_search("test", _pick(DEPTH_LABELS, ("sp/standard",
                                                         "sp/standard+depth_alpha1")),
                              "model.num_layers", (1, 2), dict.fromkeys(DEPTH_LABELS, 9),
                              tag="L", bounds=WIDTH_BOUNDS, more_seeds=(1,)),
    "sensitivity": sensitivity("graphcore_cpu", SENSITIVITY, SENSITIVITY_BEST, (0, 1, 2),
                               top=SENSITIVITY_TOP),
    "sensitivity_test": sensitivity("test", _pick(SENSITIVITY, ("standard",
                                                                "standard+qk_clip50")),
                                    {"standard": 4, "standard+qk_clip50": 4}, (0,),
                                    top=SENSITIVITY_TOP),
    "length": length("graphcore_cpu", LENGTH_LRS, ("rope", "none"), LENGTHS, (0, 1, 2)),
    "length_2025": length("graphcore_cpu", LENGTH_2025_LRS, ("rope",), LENGTHS, (0, 1, 2)),
    "length_test": length("test", {"standard": 2.0**-8, "log_n": 2.0**-8}, ("rope",),
                          "--lengths=32,64", (0,)),
    "critical_length": length_search(
        "graphcore_cpu", CRITICAL_LENGTH_BASELINES, CRITICAL_LENGTH_LAWS,
        CRITICAL_LENGTH_GAMMAS, ("rope", "none"), CRITICAL_LENGTHS, (0, 1, 2),
        learning_rate=2.0**-9, choose_at=CRITICAL_LENGTH_CHOOSE_AT),
    "normalisers": staged("graphcore_cpu", NORMALISERS, dict.fromkeys(NORMALISERS, 9),
                          bounds=PRACTICE_LR_RANGE, window=2,
                          eval_flags=(LENGTHS, "--length=100"), **PROTOCOL),
    "precision": precision("graphcore_cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                           dict.fromkeys((0, 1, 2), tuple(PRECISION_FORMATS)), lrs=LENGTH_LRS),
    # At the cpu preset's own rate.
    "precision_cpu": precision("cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                               {0: tuple(PRECISION_FORMATS)}),
    "precision_test": precision("test", ("standard", "unit_scaled"),
                                _pick(PRECISION_FORMATS, ("float32", "float16", "fp8")),
                                {0: ("float32", "float16", "fp8")}),
}
