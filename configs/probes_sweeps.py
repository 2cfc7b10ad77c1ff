r"""The sweeps of configs/probes.py: the sink and length questions on the synthetic probes.

  python sweep.py --config=configs/probes.py --sweep=probes --workdir=runs/probes

sweep.py finds this file beside the config (attnscale/experiments/sweeps.py). Every
point is an ordinary train.py run of one probe preset, then eval.py (with
`--lengths` on the length tasks). The labels are declared once, here; the page
(docs/experiments/probes.md) says what each question is, what the sweep costs and
what it found.

  probes_trigger  the sink question: on `trigger` (Ran-Milo 2026's task, on which a
                  softmax model must sink its no-trigger rows), softmax and each arm
                  that claims to remove sinks (`SINK_LABELS`)
  probes_mqar     the length question on Zoology's MQAR: each length scaling
                  (`LENGTH_LABELS`), trained at 64, evaluated at 64 ... 1024 with the
                  pairs grown and fixed
  probes_max_retrieval  the length question on the running max (Velickovic et al.
                  2024): the same labels, trained at 32, evaluated at 32 ... 512
  probes          the three together
  probes_test     two labels of each at the test presets, for the test suite

Each label's learning rate is searched by the study protocol (`staged`, seeds 1 and 2
at every near-best rate; docs/guides/sweeps.md), so the sweep has 3 seeds at every
label's best rate.
"""

from attnscale.experiments.sweep_builders import Sweep, staged

CONFIG = "probes.py"  # the config file (next to this one) these sweeps run

# Points trained together in one vmapped program by default (sweep.py --pack=R).
PACK_BY_PRESET = {"trigger_cpu": 2, "mqar_cpu": 2, "max_retrieval_cpu": 2, "trigger_test": 4,
                  "mqar_test": 4, "max_retrieval_test": 4}

# The sink question: softmax, and each arm reported to remove (or replace) the sink.
# Label -> (the config argument's scaling, field overrides). The hybrid gate (HyGA,
# arXiv 2608.11805) is not here: its definition could not be read (the page says so).
SINK_LABELS = {
    "softmax": ("standard", {}),
    "sink_learned": ("standard", {"model.sink": "learned"}),  # gpt-oss's sink logit
    "gate_headwise": ("standard", {"model.attn_gate": "headwise"}),  # Qiu et al. 2025
    "gate_elementwise": ("standard", {"model.attn_gate": "elementwise"}),
    "sigmoid": ("standard", {"model.normalizer": "sigmoid"}),
    "softpick": ("standard", {"model.normalizer": "softpick"}),
    "relu": ("standard", {"model.normalizer": "relu"}),  # ReLU/L: the paper's sink-free arm
    "stickbreaking": ("standard", {"model.normalizer": "stickbreaking"}),
    "fox": ("standard", {"model.forget_gate": True}),
    "xsa": ("standard", {"model.xsa": True}),  # Zhai 2026
    "head_norm": ("standard", {"model.head_norm": "rmsnorm"}),  # arXiv 2605.06611
}

# The length question. The simulation's exponent of the log law is p ~ 1 (1.04-1.07
# at d = 64 and 128: docs/experiments/critical_length.md), and n_power's a = 2/(d-1)
# at the probes' head dimension d = 64/2 = 32. RMS QK-norm at gains 1, 2 and 5.
LENGTH_LABELS = {
    "standard": ("standard", {}),
    "log_n": ("log_n", {}),  # s learned per head
    "log_n_fixed": ("log_n,s=1", {}),
    "log_n_power": ("log_n_power,p=1", {}),
    "n_power": ("n_power,a=0.0645", {}),
    "scale_invariant": ("scale_invariant", {}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "qk_rmsnorm_gain2": ("qk_rmsnorm,gain=2", {}),
    "qk_rmsnorm_gain5": ("qk_rmsnorm,gain=5", {}),
}

# Where each search starts (e for 2^-e: each preset's own rate) and the rates it may try.
START = {"trigger_cpu": 7, "mqar_cpu": 8, "max_retrieval_cpu": 7}
BOUNDS = (4, 12)
PROTOCOL = {"more_seeds": (), "band_seeds": (1, 2)}
# eval.py's lengths, 1x ... 16x the training length.
MQAR_LENGTHS = "--lengths=64,128,256,512,1024"
MAX_RETRIEVAL_LENGTHS = "--lengths=32,64,128,256,512"
# The trigger task at its training length only (learned positions): what makes the
# sweep run eval.py, whose eval.json holds the sink measures by row.
TRIGGER_LENGTHS = "--lengths=64"


def _search(preset, labels, lengths=None):
  return staged(preset, labels, dict.fromkeys(labels, START[preset]), bounds=BOUNDS,
                eval_flags=(lengths,) if lengths else (), **PROTOCOL)


def _together(*sweeps: Sweep) -> Sweep:
  """The points of several sweeps, in order (each keeps its own preset's runs)."""
  return Sweep(sweeps[0].preset, lambda workdir: [p for s in sweeps for p in s.points(workdir)])


def _pick(labels: dict, keys) -> dict:
  return {k: labels[k] for k in keys}


TRIGGER = _search("trigger_cpu", SINK_LABELS, TRIGGER_LENGTHS)
MQAR = _search("mqar_cpu", LENGTH_LABELS, MQAR_LENGTHS)
MAX_RETRIEVAL = _search("max_retrieval_cpu", LENGTH_LABELS, MAX_RETRIEVAL_LENGTHS)

SWEEPS: dict[str, Sweep] = {
    "probes_trigger": TRIGGER,
    "probes_mqar": MQAR,
    "probes_max_retrieval": MAX_RETRIEVAL,
    "probes": _together(TRIGGER, MQAR, MAX_RETRIEVAL),
    "probes_test": _together(
        staged("trigger_test", _pick(SINK_LABELS, ("softmax", "relu")),
               dict.fromkeys(SINK_LABELS, 7), bounds=BOUNDS, more_seeds=(1,),
               eval_flags=("--lengths=16",)),
        staged("mqar_test", _pick(LENGTH_LABELS, ("standard", "log_n")),
               dict.fromkeys(LENGTH_LABELS, 7), bounds=BOUNDS, more_seeds=(1,),
               eval_flags=("--lengths=16,32",))),
}
