r"""The sweeps of configs/shakespeare_char.py: data, each point an ordinary train.py run.

  python sweep.py --config=configs/shakespeare_char.py --sweep=NAME --workdir=DIR

How sweep.py finds them: a config's sweeps live in `sweeps.py` next to it, which
names the config it is for (`CONFIG`) and defines `SWEEPS` (the names sweep.py
accepts) and `get_sweep(name, workdir=None)`: a list of points, each a config
argument plus field overrides (and eval.py flags to run after training):

    {"arg": "preset=graphcore,scaling=fully_scaled,seed=0",
     "overrides": {"learning_rate": 2**-9}}

(attnscale/experiments/sweeps.py, `load_sweep`). Here `SWEEPS` is a registry:
name -> `Sweep(preset, points)`, built by `grid`, `staged` (the staged learning-
rate search, library code: attnscale/experiments/lr_search.py; with `band_seeds`,
the study protocol), `sensitivity`, `length` or `precision`; a new sweep is one
entry. `default_pack` gives each sweep's pack size by its preset.
"""

import dataclasses
import math
from collections.abc import Callable

from attnscale.checks import check_choice

CONFIG = "shakespeare_char.py"  # the config file (next to this one) these sweeps run


@dataclasses.dataclass(frozen=True)
class Sweep:
  """One named sweep: its preset (which sets its default pack) and its points, a
  function of the sweep's workdir (a staged search reads what has finished there)."""

  preset: str
  points: Callable[[str | None], list[dict]]


def _arg(preset, scaling, seed):
  return f"preset={preset},scaling={scaling},seed={seed}"


def grid(preset, scalings, learning_rates, seeds) -> Sweep:
  """Every scaling x learning rate x seed."""
  return Sweep(preset, lambda workdir: [
      {"arg": _arg(preset, scaling, seed), "overrides": {"learning_rate": lr}}
      for scaling in scalings for lr in learning_rates for seed in seeds])


def staged(preset, labels, starts, *, bounds, more_seeds=(1, 2), band_seeds=(),
           transfer=None, window=0, window_seeds=()) -> Sweep:
  """The staged learning-rate search over {label: (scaling, overrides)}
  (attnscale/experiments/lr_search.py; `band_seeds`: the study protocol; `window`:
  seed 0 at every rate within that many octaves of each best, `window_seeds` too)."""
  def points(workdir):
    from attnscale.experiments import lr_search  # only the staged sweeps read results
    return lr_search.points(preset, labels, starts, workdir, bounds=bounds,
                            more_seeds=more_seeds, band_seeds=band_seeds, transfer=transfer,
                            window=window, window_seeds=window_seeds)
  return Sweep(preset, points)


# The sweeps: name -> Sweep, each registered below beside what it is for.
# Learning-rate x scaling grids.
SWEEP_SCALINGS = ("standard", "fully_scaled", "unit_scaled", "key_norm_sum", "cosine")
SWEEPS = {
    # Graphcore's almost-scaled attention sweep at full size (a GPU job):
    # Adam at constant LR 2^-7 ... 2^-12, 5000 steps.
    "graphcore": grid("graphcore", SWEEP_SCALINGS, [2.0**-e for e in range(7, 13)], (0,)),
    # The same at CPU size (preset graphcore_cpu): 50 runs, about an hour on 2
    # cores. The grid is wider than Graphcore's: the unit-scaled model's and
    # key_norm_sum's best learning rates sit far above the standard model's.
    "graphcore_cpu": grid("graphcore_cpu", SWEEP_SCALINGS, [2.0**-e for e in range(3, 13)],
                          (0,)),
    # Seconds: the test suite's.
    "test": grid("test", ("standard", "fully_scaled"), [2.0**-8, 2.0**-6], (0,)),
}
# The same grid under the study protocol (docs/experiments/graphcore_cpu.md): seed 0 at
# every rate of 2^-3 ... 2^-12 (the window covers the bounds), each best chosen on the
# seed mean with seeds 1 and 2 at every rate of its near-best band. On a workdir where
# `graphcore_cpu` ran it adds only the seeds (the points share their names): run the
# grid first (packs of 8), then this.
GRAPHCORE_CPU_LR_START = {"standard": 9, "fully_scaled": 10, "unit_scaled": 5,
                          "key_norm_sum": 5, "cosine": 9}  # the grid's seed-0 bests
SWEEPS["graphcore_cpu_protocol"] = staged(
    "graphcore_cpu", {s: (s, {}) for s in SWEEP_SCALINGS}, GRAPHCORE_CPU_LR_START,
    bounds=(3, 12), more_seeds=(), band_seeds=(1, 2), window=9)
# Today's practice against the seeds' scalings (README, "Today's practice"): every
# registered scaling and attention option at the graphcore_cpu size. Label ->
# (the config argument's scaling, field overrides).
PRACTICE = {
    "standard": ("standard", {}),
    "none": ("none", {}),
    "key_norm_sum": ("key_norm_sum", {}),
    "key_norm_mean": ("key_norm_mean", {}),
    "key_norm_power": ("key_norm_power", {}),  # p = 2
    "cosine": ("cosine", {}),  # learned temperature from g0 = log2(L^2 - L) = 12
    "cosine_fixed": ("cosine,temperature=12", {}),
    "qk_layernorm": ("qk_layernorm", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "inverse_d": ("inverse_d", {}),
    "log_n": ("log_n", {}),
    "log_n_ratio": ("log_n_ratio", {}),
    "fully_scaled": ("fully_scaled", {}),
    "umup": ("umup", {}),
    "unit_scaled": ("unit_scaled", {}),
    "softcap": ("standard", {"model.logit_softcap": 50.0}),  # Gemma 2's attention cap
    "sink_zero": ("standard", {"model.sink": "zero"}),
    "sink_learned": ("standard", {"model.sink": "learned"}),
    "gate_headwise": ("standard", {"model.attn_gate": "headwise"}),
    "gate_elementwise": ("standard", {"model.attn_gate": "elementwise"}),
    "sigmoid": ("standard", {"model.normalizer": "sigmoid"}),
}
# Where each label's learning-rate search starts: e for 2^-e, the best of the
# graphcore_cpu sweep (docs/results/graphcore_cpu) where it ran, else a guess from
# the logits' scale at init (smaller logits, larger rate). The search brackets it.
PRACTICE_LR_START = dict.fromkeys(PRACTICE, 9) | {
    "key_norm_sum": 5, "key_norm_power": 5, "unit_scaled": 5, "umup": 5,
    "fully_scaled": 10, "none": 10, "inverse_d": 8}
PRACTICE_LR_RANGE = (3, 12)  # the search never leaves 2^-3 ... 2^-12
# Stage 1 (seed 0): each label at 2^-(e-1), 2^-e, 2^-(e+1), then one rate
# further while the best is at an edge of those tried ("bracketed"). Then the study
# protocol: seeds 1 and 2 at every rate of each near-best band, the best chosen on
# the seed mean, until it is bracketed on the mean (attnscale/experiments/lr_search.py).
SWEEPS["practice"] = staged("graphcore_cpu", PRACTICE, PRACTICE_LR_START,
                            bounds=PRACTICE_LR_RANGE, more_seeds=(), band_seeds=(1, 2))
SWEEPS["practice_test"] = staged("test", {k: PRACTICE[k] for k in ("standard", "sink_zero")},
                                 {"standard": 7, "sink_zero": 7}, bounds=PRACTICE_LR_RANGE,
                                 more_seeds=(1,))

# Shared keys and values (docs/experiments/shared_kv.md): model.shared_kv=True (W_K =
# W_V) beside the same scalings with separate projections, re-run here so both sit in
# one sweep with checkpoints for the diagnostics, plus a parameter-matched control:
# grouped-query attention with 2 key/value heads of 4 has exactly shared K/V's
# attention parameters (q d^2, k and v d^2/2 each, out d^2 = 3 d^2) with keys and
# values untied. Staged like the practice sweep, with the study protocol: seeds 1 and 2
# at every rate of each near-best band (band_seeds), the best on the seed mean.
SHARED_KV = {}
for _name in ("standard", "cosine", "qk_rmsnorm", "key_norm_sum"):
  SHARED_KV[_name] = PRACTICE[_name]
  SHARED_KV[_name + "_shared"] = (PRACTICE[_name][0], {"model.shared_kv": True})
SHARED_KV["standard_kv2"] = ("standard", {"model.num_kv_heads": 2})
# Starts: the practice sweep's best (docs/results/practice), the same for shared.
SHARED_KV_LR_START = {k: 4 if k.startswith("key_norm_sum") else 9 for k in SHARED_KV}
SWEEPS["shared_kv"] = staged("graphcore_cpu", SHARED_KV, SHARED_KV_LR_START,
                             bounds=PRACTICE_LR_RANGE, more_seeds=(), band_seeds=(1, 2))
SWEEPS["shared_kv_test"] = staged(
    "test", {k: SHARED_KV[k] for k in ("standard", "standard_shared")},
    {"standard": 7, "standard_shared": 7}, bounds=PRACTICE_LR_RANGE, more_seeds=(1,))
# The larger model: the cpu preset (width 128, 1000 steps) at its own rate, standard
# scaling, separate vs shared vs the parameter-matched control, three seeds.
SHARED_KV_CPU = {"separate": {}, "shared": {"model.shared_kv": True},
                 "kv2": {"model.num_kv_heads": 2}}
SWEEPS["shared_kv_cpu"] = Sweep("cpu", lambda workdir: [
    {"arg": _arg("cpu", "standard", seed), "overrides": overrides}
    for seed in (0, 1, 2) for overrides in SHARED_KV_CPU.values()])

# The width study (docs/experiments/width.md): does the best learning rate transfer
# across width? Graphcore's recipe (graphcore_cpu: 4 layers, 4 heads, Adam at a
# constant rate, 1500 steps) at widths 32 ... 256, so the head dim grows 8 ... 64
# and 1/sqrt(d) and 1/d differ. Label -> (scaling, overrides); each runs at every
# width as "label@width".
WIDTHS = (32, 64, 128, 256)
WIDTH_LABELS = {
    "sp": ("standard", {}),
    "sp_qk_rmsnorm": ("qk_rmsnorm", {}),
    "sp_inverse_d": ("inverse_d", {}),
    "mup": ("standard", {"model.parameterization": "mup"}),  # base width 64
    "unit_scaled": ("unit_scaled", {}),
    "cosine": ("cosine", {}),
}
# Starts at width 64: the practice sweep's best. Standard parameterisation's best
# rate is expected to fall as 1/width (one exponent per doubling); the unit-scaled
# model's (and muP's) to stay put. The search brackets whatever it is.
WIDTH_START_64 = {"sp": 9, "sp_qk_rmsnorm": 9, "sp_inverse_d": 8, "unit_scaled": 5,
                  "cosine": 9, "mup": 9}
WIDTH_FIXED = ("unit_scaled", "mup")  # labels whose start does not move with width


def _width_sweep(preset, labels, widths, seeds, band_seeds=()):
  """The staged search over (label, width), with the smallest width's best rate
  transferred to every other width (lr_search's `transfer`)."""
  points = {f"{label}@{w}": (scaling, overrides | {"model.width": w})
            for w in widths for label, (scaling, overrides) in labels.items()}
  starts = {f"{label}@{w}": WIDTH_START_64[label]
            + (0 if label in WIDTH_FIXED else round(math.log2(w / 64)))
            for w in widths for label in labels}
  transfer = {f"{label}@{widths[0]}": [f"{label}@{w}" for w in widths[1:]] for label in labels}
  return staged(preset, points, starts, bounds=WIDTH_BOUNDS, more_seeds=seeds,
                band_seeds=band_seeds, transfer=transfer)


WIDTH_BOUNDS = (2, 15)  # the search never leaves 2^-2 ... 2^-15
# Width-major (every label at 32, then 64, ...), then the transfer runs. Under the study
# protocol since 2026-11-27 (seeds 1 and 2 at every near-best rate); its first run
# (2026-11-24, seed 1 at each best only, 107 runs, 4.4 hours of run time) is withdrawn
# (docs/experiments/width.md) and its labels re-measured by the `transfer` sweep below.
SWEEPS["width"] = _width_sweep("graphcore_cpu", WIDTH_LABELS, WIDTHS, (), band_seeds=(1, 2))
SWEEPS["width_test"] = _width_sweep("test", {k: WIDTH_LABELS[k] for k in ("sp", "mup")},
                                    (16, 32), (1,))

# The depth variant (docs/experiments/width.md, "Depth"): 2, 4 and 8 layers at width
# 64, the standard model with and without the depth rule (model.depth_alpha, base
# depth 4: graphcore_cpu's): 1 is CompleteP's 1/L, 0.5 depth-muP's 1/sqrt(L). At
# width 64 = base_width mup is sp, so there is no mup label. Every label starts at
# graphcore_cpu's best (2^-9); the search brackets wherever it moves. Depth 2's best
# rate is transferred to 4 and 8. About 3 labels x 3 depths x 8-10 runs, 2-3 hours.
DEPTHS = (2, 4, 8)
DEPTH_LABELS = {
    "sp": ("standard", {}),
    "complete_p": ("standard", {"model.depth_alpha": 1.0}),
    "depth_mup": ("standard", {"model.depth_alpha": 0.5}),
}


def _depth_sweep(preset, labels, depths, seeds, band_seeds=()):
  points = {f"{label}@L{n}": (scaling, overrides | {"model.num_layers": n})
            for n in depths for label, (scaling, overrides) in labels.items()}
  starts = dict.fromkeys(points, 9)
  transfer = {f"{label}@L{depths[0]}": [f"{label}@L{n}" for n in depths[1:]]
              for label in labels}
  return staged(preset, points, starts, bounds=WIDTH_BOUNDS, more_seeds=seeds,
                band_seeds=band_seeds, transfer=transfer)


# The transfer study (issue #41, docs/experiments/width.md "Transfer"): how should
# attention be scaled as the model grows, and which parameterisation or optimizer makes
# the best learning rate transfer across width? {sp + Adam, muP + Adam, sp + Muon} x
# attention {standard, qk_rmsnorm, cosine} (muP is defined for all three:
# attnscale/models/mup.py), plus u-muP (the unit model with u-muP's attention, residual
# and per-parameter rates) and sp + Muon + QK-clip (standard, tau = 50 as the
# sensitivity study's). Widths 32 ... 256 at 4 layers, graphcore_cpu's recipe otherwise:
# its Adam with weight decay 0 is AdamW with decay 0, so "Adam" here is the AdamW.
# Muon takes Moonlight's rule (config.muon_lr_rule's default): its update RMS matches
# AdamW's, so one learning rate serves its matrices and its Adam parameters.
#
# Rates: the staged search with the study protocol (band seeds 1 and 2 at every
# near-best rate, the best on the seed mean), in whole octaves: lr_search's exponents
# are integers throughout (trial names, run directories, the near-best band), and the
# band's three seeds already say which neighbouring octaves are within noise; a
# half-octave grid would about double the runs. The search at each width is its own;
# the smallest width's best also runs at every other width (transfer). Sensitivity:
# seed 0 also runs every rate within two octaves of each best (`window`), so that
# Wortsman et al.'s S is over the same five rates around the best at every width
# (attnscale/studies/transfer_sensitivity.py); about 1-2 runs more per label and width, the
# higher of them often diverging early.
TRANSFER_ATTENTIONS = ("standard", "qk_rmsnorm", "cosine")
UMUP = {"model.parameterization": "umup", "model.scaling": "umup",
        "model.unit.attn_residual": "rule"}
TRANSFER_LABELS = {
    **{f"sp_adam_{a}": (a, {}) for a in TRANSFER_ATTENTIONS},
    **{f"mup_adam_{a}": (a, {"model.parameterization": "mup"}) for a in TRANSFER_ATTENTIONS},
    **{f"sp_muon_{a}": (a, {"optimizer": "muon"}) for a in TRANSFER_ATTENTIONS},
    "umup": ("unit_scaled", UMUP),
    "sp_muon_qk_clip": ("standard", {"optimizer": "muon", "qk_clip": 50.0}),
    # Two controls from the earlier width study (docs/experiments/width.md), re-measured
    # under the protocol: muP's 1/d attention alone (sp otherwise), and the unit-scaled
    # model with unit init and one global Adam rate (u-muP without its rate rules).
    "sp_adam_inverse_d": ("inverse_d", {}),
    "sp_adam_unit_scaled": ("unit_scaled", {}),
}
# Starts at width 64 (e for 2^-e): graphcore_cpu's best for the Adam labels (muP equals
# sp at its base width 64) and for Muon (Moonlight's rule matches AdamW's update RMS);
# u-muP's rates are absolute (hidden matrices at lr / sqrt(fan_in L) = lr/16 at 64),
# so its start is the unit model's 2^-5 x 16 = 2^-1. The controls start at the width
# study's bests at 64 (1/d 2^-8, the unit model 2^-5). sp's start moves one octave per
# doubling of width; the others' stay put (the rules they claim), and the unit model's
# (whose best the width study found at 2^-5 from 32 to 128).
TRANSFER_START_64 = dict.fromkeys(TRANSFER_LABELS, 9) | {"umup": 1, "sp_adam_inverse_d": 8,
                                                          "sp_adam_unit_scaled": 5}
TRANSFER_MOVES = tuple(label for label in TRANSFER_LABELS
                       if label.startswith("sp_adam") and label != "sp_adam_unit_scaled")
TRANSFER_BOUNDS = (-3, 15)  # 2^3 (u-muP's room) ... 2^-15


def _transfer_sweep(preset, labels, widths, start_64, start_at=None, window_seeds=()):
  """`start_at` {label: e}: a start of 2^-e at the largest width instead of the rule;
  `window_seeds`: seeds also run at every rate of each best's window (S per seed)."""
  points = {f"{label}@{w}": (scaling, overrides | {"model.width": w})
            for w in widths for label, (scaling, overrides) in labels.items()}
  starts = {f"{label}@{w}": start_64[label]
            + (round(math.log2(w / 64)) if label in TRANSFER_MOVES else 0)
            for w in widths for label in labels}
  starts |= {f"{label}@{widths[-1]}": e for label, e in (start_at or {}).items()}
  transfer = {f"{label}@{widths[0]}": [f"{label}@{w}" for w in widths[1:]] for label in labels}
  return staged(preset, points, starts, bounds=TRANSFER_BOUNDS, more_seeds=(),
                band_seeds=(1, 2), transfer=transfer, window=2, window_seeds=window_seeds)


# Size: 13 labels x 4 widths = 52 searches. Each is about 4 rates at seed 0 and seeds 1
# and 2 at 2-3 near-best rates, about 9 runs, plus the 39 transfer runs and the windows:
# about 550 runs (the two controls joined on 2026-11-27, after the other 11 had run).
# At graphcore_cpu's 50 s a run at width 64 (the width study measured 144 s a run on
# average over widths 32 ... 256), about 17 hours of run time: 8-9 hours on 2 cores
# with --jobs=2, perhaps 5-6 with packing (8 a pack; the widths 32 and 64 gain most).
# An estimate, not measured.
SWEEPS["transfer"] = _transfer_sweep("graphcore_cpu", TRANSFER_LABELS, WIDTHS,
                                     TRANSFER_START_64)
# Sensitivity with seeds: S (Wortsman et al.) is over the five rates around each best,
# which the protocol's seeds 1 and 2 cover only where they are in the band, so S has
# seed 0 alone. This sweep is the transfer sweep's searches of sp + Adam with standard,
# RMS QK-norm and cosine attention (Wortsman et al.'s comparison: does S grow with
# width, and does normalising q and k stop it?) with seeds 1 and 2 at every window rate
# too: the same run names, so on the transfer sweep's workdir only those seeds are new
# (84 on the archive of 2026-11-27, 18 of them at width 256).
TRANSFER_SENSITIVITY_LABELS = ("sp_adam_standard", "sp_adam_qk_rmsnorm", "sp_adam_cosine")
SWEEPS["transfer_sensitivity"] = _transfer_sweep(
    "graphcore_cpu", {k: TRANSFER_LABELS[k] for k in TRANSFER_SENSITIVITY_LABELS}, WIDTHS,
    TRANSFER_START_64, window_seeds=(1, 2))
# The same for every other label (muP, Muon, u-muP, QK-clip, the controls), whose S has
# seed 0 alone until it runs: seeds 1 and 2 at the window rates outside each band.
# 239 new runs on the archive of 2026-11-28 (66, 62, 54 and 57 at widths 32 ... 256; more
# at 256 as its searches settle): for a lent GPU
# (`SWEEP=transfer_sensitivity_all bash benchmarks/gpu_session.sh finish`) or a CPU
# once the transfer sweep is finished (`--only` a width at a time).
SWEEPS["transfer_sensitivity_all"] = _transfer_sweep(
    "graphcore_cpu", {k: v for k, v in TRANSFER_LABELS.items()
                      if k not in TRANSFER_SENSITIVITY_LABELS}, WIDTHS,
    TRANSFER_START_64, window_seeds=(1, 2))

# Width 512 for the labels that matter most (the "if the budget allows"): a
# width-512 run costs about 4x a width-256 one, so this is for lent GPUs, after the
# transfer sweep's width-256 points. Its width-32 points are the transfer sweep's own
# (the same names: on the same workdir they are done, and width 32's best is what the
# transfer runs at 512 take). In the order to run them: the sp + Adam baseline and its
# QK-norm, muP, u-muP, then Muon with and without QK-clip (where the logits grow most).
# Starts at 512 extrapolate each label's committed best at 256 by its slope so far
# (docs/results/transfer, 2026-11-27): sp + Adam one octave lower, muP and u-muP the same,
# Muon one octave lower; the search brackets wherever the best is.
TRANSFER_512_LABELS = ("sp_adam_standard", "sp_adam_qk_rmsnorm", "mup_adam_standard", "umup",
                       "sp_muon_standard", "sp_muon_qk_clip")
TRANSFER_START_512 = {"sp_adam_standard": 12, "sp_adam_qk_rmsnorm": 13, "mup_adam_standard": 9,
                      "umup": 2, "sp_muon_standard": 11, "sp_muon_qk_clip": 11}
SWEEPS["transfer_512"] = _transfer_sweep(
    "graphcore_cpu", {k: TRANSFER_LABELS[k] for k in TRANSFER_512_LABELS}, (32, 512),
    TRANSFER_START_64, start_at=TRANSFER_START_512)
# muP's base multipliers (issue #41: `model.mup_output_mult` and `model.mup_attn_mult`
# join the search "where the budget allows"). muP claims the best (rate, multipliers)
# found on a small model stays best as it widens (Tensor Programs V tunes them on the
# proxy); the transfer sweep ran muP at multipliers 1 (sp's readout and attention at the
# base width 64). Here, at width 32, each multiplier alone at 1/4, 1/2, 2 and 4 (the
# other at 1; a coordinate search, not TP V's joint random search) gets its own rate
# search under the protocol, beside the transfer sweep's own mup_adam_standard@32 (the
# same run names: copy those runs into the workdir and they count as done). About
# 8 x 10 width-32 runs, 45 minutes of one core. Cosine refuses an attention multiplier
# (its temperature is learned), so the search is muP with standard attention.
MUP_MULT_VALUES = (0.25, 0.5, 2.0, 4.0)
MUP_MULT_LABELS = {"mup_adam_standard": TRANSFER_LABELS["mup_adam_standard"]} | {
    f"mup_adam_standard_{kind}{m:g}": ("standard", {"model.parameterization": "mup",
                                                    f"model.mup_{kind}_mult": m})
    for kind in ("output", "attn") for m in MUP_MULT_VALUES}
SWEEPS["mup_mults"] = _transfer_sweep("graphcore_cpu", MUP_MULT_LABELS, (32,),
                                      dict.fromkeys(MUP_MULT_LABELS, 9))
# The second half at width 256, where untuned muP trains 0.125 nats above sp + Adam
# (docs/experiments/transfer.md): does a multiplier that width 32 could not tell from 1
# matter there? Each label at its own width-32 best rate (seed mean, docs/results/
# mup_mults), 3 seeds, against mup_adam_standard's 3 at 2^-9. At width 256 an output
# multiplier of 4 gives sp's readout (4 x 64/256 = 1) and an attention multiplier of 2
# sp's 1/sqrt(d) logits (2 sqrt(64/256) = 1): what each of muP's two forward-pass rules
# costs at that width. Six width-256 runs, about two hours of one core.
MUP_MULTS_256 = {"mup_adam_standard_output4": 9, "mup_adam_standard_attn2": 10}
SWEEPS["mup_mults_256"] = Sweep("graphcore_cpu", lambda workdir: [
    {"arg": _arg("graphcore_cpu", "standard", seed),
     "overrides": MUP_MULT_LABELS[label][1] | {"learning_rate": 2.0**-e, "model.width": 256}}
    for label, e in MUP_MULTS_256.items() for seed in (0, 1, 2)])
# What is left of muP's gap at 256 is its rates or its forward pass: muP keeps the
# embeddings', gains' and biases' Adam rate (2^-9 at 256) where sp's best gives them
# 2^-11. `model.mup_vector_lr = "per_width"` (an ablation, not muP) trains them at
# lr x 64/256 too, so at 2^-9 every parameter has sp's best rate at 256 and only the
# forward pass (1/m readout, 1/d attention, hidden init / sqrt(m)) is muP's. Paired by
# seed against mup_adam_standard and sp_adam_standard there; seed 0 also an octave
# either side, to see that 2^-9 is not simply a bad rate for this model, and since
# 2^-8 was better on seed 0, 3 seeds there and seed 0 at 2^-7. Eight width-256 runs,
# three packs: about 1.5 hours of one core.
MUP_VECTOR_LABEL = "mup_adam_standard_vector_lr_per_width"
SWEEPS["mup_vector_lr_256"] = Sweep("graphcore_cpu", lambda workdir: [
    {"arg": _arg("graphcore_cpu", "standard", seed),
     "overrides": TRANSFER_LABELS["mup_adam_standard"][1] | {
         "model.mup_vector_lr": "per_width", "learning_rate": 2.0**-e, "model.width": 256}}
    for e, seeds in ((9, (0, 1, 2)), (8, (0, 1, 2)), (10, (0,)), (7, (0,))) for seed in seeds])
# What sets Muon's slope of -1 (docs/experiments/transfer.md)? Under Moonlight's rule
# the Muon-trained square matrices' updates have spectral norm about 0.2 sqrt(width) x
# rate, so the spectral condition (Yang, Simon and Bernstein 2023) asks for a rate
# falling as width^-1/2; the embeddings, gains and readout train with AdamW at the same
# rate, and sp's readout under Adam wants 1/width. Here the AdamW branch's rate is
# decoupled and falls as 1/width (`muon_adam_lr_base_width` = 64: Muon's rate at width
# 64, so that width's runs equal sp_muon_standard's), Muon's own rate searched at every
# width under the protocol. If its best then falls as width^-1/2 (or less), the AdamW
# branch set the -1. Widths 32-128 on the CPU (about 30 runs), 256 with the transfer
# sweep's GPU points.
MUON_ADAM_LABEL = "sp_muon_standard_adam_per_width64"
SWEEPS["muon_adam_width"] = staged(
    "graphcore_cpu",
    {f"{MUON_ADAM_LABEL}@{w}": ("standard", {"optimizer": "muon", "model.width": w,
                                             "muon_adam_lr_base_width": 64})
     for w in WIDTHS},
    {f"{MUON_ADAM_LABEL}@{w}": 7 + (w > 64) for w in WIDTHS},  # sp_muon_standard's bests
    bounds=TRANSFER_BOUNDS, more_seeds=(), band_seeds=(1, 2), window=2,
    transfer={f"{MUON_ADAM_LABEL}@{WIDTHS[0]}": [f"{MUON_ADAM_LABEL}@{w}" for w in WIDTHS[1:]]})
# Seconds: one label of each kind at widths 16 and 32 of the test preset (2 layers).
SWEEPS["transfer_test"] = _transfer_sweep(
    "test", {k: TRANSFER_LABELS[k] for k in ("sp_adam_standard", "mup_adam_qk_rmsnorm",
                                             "sp_muon_cosine", "umup", "sp_muon_qk_clip")},
    (16, 32), dict.fromkeys(TRANSFER_LABELS, 7) | {"umup": 1})

# The study protocol: seeds 1 and 2 at every rate of each near-best band.
SWEEPS["depth"] = _depth_sweep("graphcore_cpu", DEPTH_LABELS, DEPTHS, (), band_seeds=(1, 2))
SWEEPS["depth_test"] = _depth_sweep("test", {k: DEPTH_LABELS[k] for k in ("sp", "complete_p")},
                                    (1, 2), (1,))

# The learning-rate sensitivity study (docs/experiments/sensitivity.md; Wortsman et
# al. 2023): each label from two rates below its best (the practice sweep's,
# docs/results/practice) up to 2^-2, well past where the standard model diverges,
# two seeds. QK-clip at 50, the soft-cap's value, so the two bounds compare.
SENSITIVITY = {
    "standard": ("standard", {}),
    "qk_layernorm": ("qk_layernorm", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "cosine": ("cosine", {}),
    "softcap": ("standard", {"model.logit_softcap": 50.0}),
    "qk_clip": ("standard", {"qk_clip": 50.0}),
    "sink_learned": ("standard", {"model.sink": "learned"}),
    "unit_scaled": ("unit_scaled", {}),
}
SENSITIVITY_BEST = dict.fromkeys(SENSITIVITY, 9) | {"unit_scaled": 5}  # practice's best e
SENSITIVITY_TOP = 2  # the largest rate: 2^-2


def sensitivity(preset, labels, best, seeds) -> Sweep:
  """Each label from two rates below its best exponent up to 2^-SENSITIVITY_TOP.
  Seed-major, and within a seed the highest rates first, every label at each: a
  sweep stopped early has every label where they differ most (and the diverging
  runs are the short ones)."""
  return Sweep(preset, lambda workdir: [
      {"arg": _arg(preset, scaling, seed), "overrides": {"learning_rate": 2.0**-e, **overrides}}
      for seed in seeds for e in range(SENSITIVITY_TOP, max(best.values()) + 3)
      for label, (scaling, overrides) in labels.items() if e <= best[label] + 2])


# Three seeds at every rate (the study protocol's least): 3 x 76 = 228 runs, each
# (label, rate)'s seeds in one pack.
SWEEPS["sensitivity"] = sensitivity("graphcore_cpu", SENSITIVITY, SENSITIVITY_BEST, (0, 1, 2))
SWEEPS["sensitivity_test"] = sensitivity(
    "test", {k: SENSITIVITY[k] for k in ("standard", "qk_clip")}, {"standard": 4, "qk_clip": 4},
    (0,))

# The length study's learning rates: each scaling's best in the graphcore_cpu sweep
# (docs/results/graphcore_cpu/results.md); the scalings that sweep did not cover
# take standard's (log_n and log_n_ratio equal standard at the training length,
# qk_layernorm is as close to it at initialisation).
LENGTH_LRS = {"standard": 2.0**-9, "log_n": 2.0**-9, "log_n_ratio": 2.0**-9,
              "key_norm_sum": 2.0**-5, "fully_scaled": 2.0**-10, "cosine": 2.0**-9,
              "qk_layernorm": 2.0**-9, "unit_scaled": 2.0**-5}
# The length study (README, "Length generalisation"): trained at 64 (preset
# graphcore_cpu), evaluated at 1x ... 16x; rotary and no positions, three seeds (the
# study protocol's least: docs/guides/sweeps.md), each scaling at its LENGTH_LRS rate.
# 48 runs, each seed's in one pack: about 40 minutes on 2 idle cores.


def length(preset, lrs, positions, lengths, seeds) -> Sweep:
  """Each {scaling: learning rate} x positions x seed, then eval.py `lengths`.
  Seed-major: after the first half, every (scaling, positions) has one run."""
  return Sweep(preset, lambda workdir: [
      {"arg": _arg(preset, scaling, seed),
       "overrides": {"learning_rate": lr, "model.positions": pos},
       "eval": [lengths, "--length=100"]}
      for seed in seeds for pos in positions for scaling, lr in lrs.items()])


SWEEPS["length"] = length("graphcore_cpu", LENGTH_LRS, ("rope", "none"),
                          "--lengths=64,128,256,512,1024", (0, 1, 2))
# The 2025 temperature scalings in the same study (rotary only, three seeds), with
# standard and learned log_n again as the baselines in the same table: Llama 4's
# temperature_tuning and YaRN's temperature (both standard within the training
# length), and critical log-n scaling, logits x s log n_i with s fixed at 1 and 2
# (the critical gamma 1/(1 - rho) for rho = 0 and 1/2; docs/science.md). Keys are
# config arguments; every label at standard's rate. 18 runs, about 15 minutes.
LENGTH_2025_LRS = {"standard": 2.0**-9, "log_n": 2.0**-9, "temperature_tuning": 2.0**-9,
                   "yarn": 2.0**-9, "log_n,s=1": 2.0**-9, "log_n,s=2": 2.0**-9}
SWEEPS["length_2025"] = length("graphcore_cpu", LENGTH_2025_LRS, ("rope",),
                               "--lengths=64,128,256,512,1024", (0, 1, 2))
# Seconds: the test suite's length sweep.
SWEEPS["length_test"] = length("test", {"standard": 2.0**-8, "log_n": 2.0**-8}, ("rope",),
                               "--lengths=32,64", (0,))


# The precision study (README, "Low precision"; docs/science.md, "Low precision"):
# each scaling at its graphcore_cpu learning rate (LENGTH_LRS), in every model.dtype
# with no loss scaling, and fp8 also with per-tensor scaling (the conventional
# baseline).
PRECISION_SCALINGS = ("standard", "fully_scaled", "cosine", "qk_layernorm", "key_norm_sum",
                      "unit_scaled")
PRECISION_FORMATS = {  # label -> field overrides (float32: none)
    "float32": {},
    "bfloat16": {"model.dtype": "bfloat16"},
    "float16": {"model.dtype": "float16"},
    "fp8": {"model.dtype": "fp8"},
    "fp8_per_tensor": {"model.dtype": "fp8", "model.fp8_scaling": "per_tensor"},
}
# Seeds 0, 1 and 2 in every format (the study protocol's least, so that each format
# is compared with float32 paired by seed): 6 x 5 x 3 = 90 runs, each (scaling,
# format)'s seeds in one pack, about 3-4 hours on 2 idle cores (the 42 runs of seed 0
# everywhere and seed 1 in float32 and fp8 took about an hour and a half).


def precision(preset, scalings, formats, seeds, lrs=None) -> Sweep:
  """Each scaling x format ({label: overrides}) x seed ({seed: its formats}), at
  `lrs[scaling]` (None: the preset's rate)."""
  lr = lambda scaling: {"learning_rate": lrs[scaling]} if lrs else {}
  return Sweep(preset, lambda workdir: [
      {"arg": _arg(preset, scaling, seed), "overrides": lr(scaling) | formats[f]}
      for seed, seed_formats in seeds.items() for scaling in scalings for f in seed_formats])


SWEEPS["precision"] = precision("graphcore_cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                                dict.fromkeys((0, 1, 2), tuple(PRECISION_FORMATS)),
                                lrs=LENGTH_LRS)
# The same at the cpu preset (about 6 hours), each scaling at the preset's 2e-3.
SWEEPS["precision_cpu"] = precision("cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                                    {0: tuple(PRECISION_FORMATS)})
# Seconds: the test suite's.
SWEEPS["precision_test"] = precision(
    "test", ("standard", "unit_scaled"),
    {k: PRECISION_FORMATS[k] for k in ("float32", "float16", "fp8")},
    {0: ("float32", "float16", "fp8")})


# Points trained together in one vmapped program by default (sweep.py --pack=K
# overrides; 1 = one train.py process a point): those of a sweep that differ only in
# seed, learning rate and the like (attnscale/runtime/packing.py), up to K at a time.
# By preset (docs/benchmarks.md, "Sweeps: runs per hour and packing", measured on
# 2 cores): at graphcore_cpu a pack of 8 makes the one-process sweep 1.7x faster
# (start-up shared) and equals --jobs=2 when run as two pinned packs; larger packs
# of the cpu preset leave the cache. On an accelerator, pack far more (--pack).
PACK_BY_PRESET = {"graphcore_cpu": 8, "test": 4, "cpu": 2, "graphcore": 8}


def default_pack(name: str) -> int:
  """How many points of sweep `name` sweep.py packs into one program by default."""
  check_choice("sweep", name, SWEEPS)
  return PACK_BY_PRESET.get(SWEEPS[name].preset, 1)


def get_sweep(name: str, workdir: str | None = None) -> list[dict]:
  """The points of sweep `name` (`SWEEPS`), reading the finished runs in `workdir`
  where it is staged."""
  check_choice("sweep", name, SWEEPS)
  return SWEEPS[name].points(workdir)
