r"""The sweeps of configs/gpt2.py: the seeds' two experiments at GPT-2 124M.

  python sweep.py --config=configs/gpt2.py --sweep=seeds --workdir=runs/gpt2_seeds

(sweep.py finds this file as configs/gpt2.py's own `<config>_sweeps.py`:
attnscale/experiments/sweeps.py, `load_sweep`). Each point is an ordinary train.py
run of preset `small` (10B tokens, nanoGPT's recipe) in its own sub-directory;
finished points are skipped, interrupted ones resume. Every label trains at
nanoGPT's 6e-4: the sweeps compare the options at GPT-2's tuned rate, not each at its
own best. (In the CPU studies every label here had the same best rate as standard,
2^-9, but RMS QK-norm with shared K/V, at 2^-8: docs/experiments/practice.md,
shared_kv.md.)

  shared_kv  standard attention; shared keys and values (model.shared_kv: W_K = W_V);
             the parameter-matched control, grouped-query attention with 6 key/value
             heads of 12 (q d^2 + k, v d^2/2 each + out d^2 = 3 d^2, shared K/V's
             count) with keys and values untied (docs/experiments/shared_kv.md).
  qk_norm    standard against cosine attention (learned temperature) and the two
             QK-norms, LayerNorm and RMSNorm (docs/experiments/practice.md).
  seeds      both, standard once (docs/guides/gpt2.md says what a run costs).
  test       the same labels at preset=test: seconds each, for the test suite.
"""

from attnscale.experiments.sweep_builders import Sweep, seeds_first

CONFIG = "gpt2.py"  # the config file (next to this one) these sweeps run

# label -> (the config argument's scaling, field overrides)
SHARED_KV = {
    "standard": ("standard", {}),
    "shared_kv": ("standard", {"model.shared_kv": True}),
    "kv_heads6": ("standard", {"model.num_kv_heads": 6}),
}
QK_NORM = {
    "standard": ("standard", {}),
    "cosine": ("cosine", {}),
    "qk_layernorm": ("qk_layernorm", {}),  # the registered scalings, as the CPU studies ran
    "qk_rmsnorm": ("qk_rmsnorm", {}),
}
# Each label x seed, seed-major (after the first seed every label has a run).
SWEEPS: dict[str, Sweep] = {
    "shared_kv": seeds_first("small", SHARED_KV, (0,)),
    "qk_norm": seeds_first("small", QK_NORM, (0,)),
    "seeds": seeds_first("small", SHARED_KV | QK_NORM, (0,)),
    # test: 2 heads, so the control has 1 key/value head.
    "test": seeds_first("test", SHARED_KV | QK_NORM | {
        "kv_heads6": ("standard", {"model.num_kv_heads": 1})}, (0,)),
}
