r"""The sweeps of configs/bert_small.py: which attention scaling trains the small BERT best.

  python sweep.py --config=configs/bert_small.py --sweep=bert --workdir=runs/bert_sweep

sweep.py finds this file beside the config (`<config>_sweeps.py`,
attnscale/experiments/sweeps.py). Each point is an ordinary train.py run of
configs/bert_small.py (a config argument plus field overrides); points that differ
only in seed and learning rate are trained together in one vmapped program
(`default_pack`, attnscale/runtime/packed.py).

The `bert` sweep follows the study protocol (attnscale/experiments/lr_search.py,
`points(..., more_seeds=(), band_seeds=(1, 2))`): stage 1 tries each label at
2^-(e-1), 2^-e, 2^-(e+1) with seed 0 and one rate further while the best is at an
edge; then seeds 1 and 2 at every rate within noise of the best (the near-best
band), the best being chosen on the mean over seeds and bracketed on it. The
score is the final training MLM loss (train.py's window); compare the winners with
eval.py afterwards.
What the sweep costs: docs/experiments/bert.md.
"""

from attnscale.experiments.sweep_builders import Sweep, staged

CONFIG = "bert_small.py"  # the config file (next to this one) these sweeps run

# Label -> (the config argument's scaling, and ln=..., field overrides). The
# model is BERT's post-LN encoder unless the label says otherwise; `standard_pre`
# is the pre-LN encoder, the GPT's block (and the unit-scaled model's).
BERT = {
    "standard": ("standard", {}),
    "standard_pre": ("standard,ln=pre", {}),
    "key_norm_sum": ("key_norm_sum", {}),
    "cosine": ("cosine", {}),  # learned temperature from log2(T^2 - T)
    "qk_layernorm": ("qk_layernorm", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "fully_scaled": ("fully_scaled", {}),
    "umup": ("umup", {}),
    "inverse_d": ("inverse_d", {}),
    "unit_scaled": ("unit_scaled", {}),  # model.variant=unit: pre-LN, tied readout
}
# Where each label's search starts: e for 2^-e. The cpu preset's 2e-3 ~ 2^-9 for
# the standard models; for the others the char LM's practice sweep's best
# (configs/shakespeare_char_sweeps.py, PRACTICE_LR_START): large rates for the models
# whose logits start small. The search brackets wherever the best is.
BERT_LR_START = dict.fromkeys(BERT, 9) | {
    "key_norm_sum": 5, "unit_scaled": 5, "umup": 5, "fully_scaled": 10, "inverse_d": 8}
# The search never leaves 2^-1 ... 2^-12: the unit-scaled model's rates are absolute,
# of order 2^-1 ... 2^1 in u-muP (Blake et al. 2024); only a label whose best reaches
# 2^-3 searches that high (docs/experiments/bert.md).
LR_RANGE = (1, 12)
# A final training MLM loss at or above this learned nothing (docs/experiments/bert.md):
# such a run counts as diverged in the search (lr_search's `no_learning`), so a label
# that failed at every rate tried searches smaller rates instead of adding seeds to a
# failure. The test preset's short runs end higher: no threshold there.
NO_LEARNING = {"cpu": 6.0}
# Points packed into one program by default (sweep.py --pack=R overrides): the 3
# rates of a label's first stage, or its band's seeds.
PACK_BY_PRESET = {"cpu": 3, "test": 4}

# The normalisers study's BERT runs (docs/experiments/normalisers.md): softmax and the
# three sink-removal and ReLU claims that need no causal order (stick-breaking, FoX and
# selective attention are causal only). The post-LN encoder with RoPE (the cpu preset's
# positions) and the scaling 1/sqrt(d); every search starts at standard's best, 2^-8.
BERT_NORMALISERS = {
    "softmax": ("standard", {}),
    "gate_elementwise": ("standard", {"model.attn_gate": "elementwise"}),
    "softpick": ("standard", {"model.normalizer": "softpick"}),
    "relu": ("standard", {"model.normalizer": "relu"}),
}

SWEEPS: dict[str, Sweep] = {
    "bert": staged("cpu", BERT, BERT_LR_START, bounds=LR_RANGE, no_learning=NO_LEARNING["cpu"],
                   more_seeds=(), band_seeds=(1, 2)),
    "bert_test": staged("test", {k: BERT[k] for k in ("standard", "standard_pre")},
                        {"standard": 7, "standard_pre": 7}, bounds=LR_RANGE, more_seeds=(),
                        band_seeds=(1,)),
    "bert_normalisers": staged("cpu", BERT_NORMALISERS, dict.fromkeys(BERT_NORMALISERS, 8),
                               bounds=LR_RANGE, no_learning=NO_LEARNING["cpu"], more_seeds=(),
                               band_seeds=(1, 2)),
    "bert_normalisers_test": staged("test", BERT_NORMALISERS, dict.fromkeys(BERT_NORMALISERS, 7),
                                    bounds=LR_RANGE, more_seeds=(), band_seeds=(1,)),
}
