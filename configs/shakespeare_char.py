r"""Character-level language model on tiny Shakespeare: nanoGPT's shakespeare_char in JAX.

Launch (any scaling from `attnscale.scalings.names()`; every field overridable):

  python train.py --config=configs/shakespeare_char.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/char_cpu_key_norm_sum
  python eval.py --workdir=runs/char_cpu_key_norm_sum
  python train.py --config=configs/shakespeare_char.py:preset=nanogpt --workdir=runs/nanogpt \
      --config.num_train_steps=2000

Config argument keys: preset (nanogpt | graphcore | graphcore_cpu | cpu | test), scaling, p (the
power for scaling=key_norm_power), temperature (scaling=cosine with this fixed temperature
instead of the learned one; 0 = learned), seed. scaling=unit_scaled selects the
unit-scaled, residual-weighted transformer (model.variant=unit) with fully scaled
attention and Graphcore's relative attention weight.

Presets and what to expect:
  nanogpt   nanoGPT's config/train_shakespeare_char.py exactly (6 layers, 6 heads,
            width 384, block 256, batch 64, dropout 0.2, AdamW 1e-3 cosine to 1e-4,
            warm-up 100, beta2 0.99, clip 1.0, 5000 steps). nanoGPT reports a best
            validation loss of 1.4697. A GPU job (minutes on one GPU).
  graphcore Graphcore's almost-scaled-attention demo: 4 layers, width 256, 4 heads,
            seq 256, batch 16, Adam, constant LR, no warm-up, no dropout, 5000
            steps; sweep LR over 2^-7 ... 2^-12. Graphcore (byte-level complete
            works) report baseline about 1.2, fully scaled about 1.4.
  graphcore_cpu  Graphcore's recipe at 4 layers, width 64, seq 64, batch 16,
            1500 steps: the CPU learning-rate sweep (get_sweep("graphcore_cpu")).
  cpu       4 layers, width 128, 4 heads, seq 128, batch 32, 1000 steps: a
            useful model in about 10 minutes on 2 CPU cores (see README).
  test      seconds: for the test suite.
"""

import math
import os

import ml_collections
from ml_collections import config_dict

from attnscale.runtime import configlib

PRESETS = ("nanogpt", "graphcore", "graphcore_cpu", "cpu", "test")


# Sweeps are data: lists of points (a config argument plus field overrides),
# each an ordinary train.py run; `python sweep.py --config=configs/shakespeare_char.py
# --sweep=NAME --workdir=DIR` runs them (attnscale/experiments/sweeps.py).
SWEEP_SCALINGS = ("standard", "fully_scaled", "unit_scaled", "key_norm_sum", "cosine")
SWEEPS = {
    # Graphcore's almost-scaled attention sweep at full size (a GPU job):
    # Adam at constant LR 2^-7 ... 2^-12, 5000 steps.
    "graphcore": ("graphcore", SWEEP_SCALINGS, [2.0**-e for e in range(7, 13)], (0,)),
    # The same at CPU size (preset graphcore_cpu): 50 runs, about an hour on 2
    # cores. The grid is wider than Graphcore's: the unit-scaled model's and
    # key_norm_sum's best learning rates sit far above the standard model's.
    "graphcore_cpu": ("graphcore_cpu", SWEEP_SCALINGS, [2.0**-e for e in range(3, 13)], (0,)),
    # Seconds: the test suite's.
    "test": ("test", ("standard", "fully_scaled"), [2.0**-8, 2.0**-6], (0,)),
}
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
# further while the best is at an edge of those tried ("bracketed"). Stage 2:
# seeds 1 and 2 at the bracketed best, so the table gives mean ± s.e. over 3 seeds.
SWEEPS["practice"] = ("graphcore_cpu", PRACTICE, PRACTICE_LR_START, (1, 2))
SWEEPS["practice_test"] = ("test", {k: PRACTICE[k] for k in ("standard", "sink_zero")},
                           {"standard": 7, "sink_zero": 7}, (1,))

# The length study's learning rates: each scaling's best in the graphcore_cpu sweep
# (docs/results/graphcore_cpu/results.md); the scalings that sweep did not cover
# take standard's (log_n and log_n_ratio equal standard at the training length,
# qk_layernorm is as close to it at initialisation).
LENGTH_LRS = {"standard": 2.0**-9, "log_n": 2.0**-9, "log_n_ratio": 2.0**-9,
              "key_norm_sum": 2.0**-5, "fully_scaled": 2.0**-10, "cosine": 2.0**-9,
              "qk_layernorm": 2.0**-9, "unit_scaled": 2.0**-5}
# The length study (README, "Length generalisation"): trained at 64 (preset
# graphcore_cpu), evaluated at 1x ... 16x; rotary and no positions, two seeds,
# each scaling at its LENGTH_LRS rate. 32 runs, about an hour.
# (preset, {scaling: learning rate}, positions, eval.py --lengths flag, seeds)
SWEEPS["length"] = ("graphcore_cpu", LENGTH_LRS, ("rope", "none"),
                    "--lengths=64,128,256,512,1024", (0, 1))
# Seconds: the test suite's length sweep.
SWEEPS["length_test"] = ("test", {"standard": 2.0**-8, "log_n": 2.0**-8}, ("rope",),
                         "--lengths=32,64", (0,))


# The precision study (README, "Low precision"; docs/science.md, "Low precision"):
# each scaling at its graphcore_cpu learning rate (LENGTH_LRS), in every model.dtype
# with no loss scaling, and fp8 also with per-tensor scaling (the conventional
# baseline). About an hour and a half on 2 idle cores.
PRECISION_SCALINGS = ("standard", "fully_scaled", "cosine", "qk_layernorm", "key_norm_sum",
                      "unit_scaled")
PRECISION_FORMATS = {  # label -> field overrides (float32: none)
    "float32": {},
    "bfloat16": {"model.dtype": "bfloat16"},
    "float16": {"model.dtype": "float16"},
    "fp8": {"model.dtype": "fp8"},
    "fp8_per_tensor": {"model.dtype": "fp8", "model.fp8_scaling": "per_tensor"},
}
# Seed 0 in every format; seed 1 in float32 and unscaled fp8 (the two ends), for
# the seed spread: 6 x (5 + 2) = 42 runs.
SWEEPS["precision"] = ("graphcore_cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                       {0: tuple(PRECISION_FORMATS), 1: ("float32", "fp8")})
# The same at the cpu preset (about 6 hours), each scaling at the preset's 2e-3.
SWEEPS["precision_cpu"] = ("cpu", PRECISION_SCALINGS, PRECISION_FORMATS,
                           {0: tuple(PRECISION_FORMATS)})
# Seconds: the test suite's.
SWEEPS["precision_test"] = ("test", ("standard", "unit_scaled"),
                            {k: PRECISION_FORMATS[k] for k in ("float32", "float16", "fp8")},
                            {0: ("float32", "float16", "fp8")})


def _precision_points(name: str) -> list[dict]:
  """scaling x format x seed ({seed: its formats}); the graphcore_cpu sweep at each
  scaling's LENGTH_LRS rate."""
  preset, scalings, formats, seeds = SWEEPS[name]
  lr = lambda scaling: LENGTH_LRS[scaling] if name == "precision" else None
  return [{"arg": f"preset={preset},scaling={scaling},seed={seed}",
           "overrides": ({"learning_rate": lr(scaling)} if lr(scaling) else {}) | formats[f]}
          for seed, seed_formats in seeds.items() for scaling in scalings
          for f in seed_formats]


def _practice_points(name: str, workdir: str | None) -> list[dict]:
  """Stage 1 (a bracketing learning-rate search per label, seed 0), then each
  bracketed label's seeds. Reads the finished runs in `workdir`."""
  from attnscale.experiments import sweep_results, sweeps  # only the staged sweep reads results

  preset, labels, starts, more_seeds = SWEEPS[name]
  lo, hi = PRACTICE_LR_RANGE

  def point(label, e, seed):
    scaling, overrides = labels[label]
    return {"arg": f"preset={preset},scaling={scaling},seed={seed}",
            "overrides": {"learning_rate": 2.0**-e, **overrides}}

  def result(p):
    if workdir is None:
      return None
    row = sweeps.read_run(os.path.join(workdir, sweeps.Point(
        p["arg"], tuple(sorted(p["overrides"].items()))).name))
    return row if row is not None and row["status"] in ("done", "diverged") else None

  points, seeds = [], []
  for label in labels:
    tried = [starts[label] + d for d in (-1, 0, 1)]
    while True:
      stage = [point(label, e, 0) for e in tried]
      points += [p for p in stage if p not in points]
      rows = [result(p) for p in stage]
      if any(r is None for r in rows):
        break  # this label's search is still running
      best = sweep_results.best_per_scaling(rows)
      # All diverged: a smaller rate; best at an edge: one step beyond it.
      e = (max(tried) if not best else
           round(-math.log2(next(iter(best.values()))["learning_rate"])))
      beyond = e + 1 if (not best or e == max(tried)) else e - 1 if e == min(tried) else None
      if beyond is not None and lo <= beyond <= hi and beyond not in tried:
        tried = sorted(tried + [beyond])
        continue
      if best:
        seeds += [point(label, e, seed) for seed in more_seeds]
      break
  return points + seeds


def get_sweep(name: str, workdir: str | None = None) -> list[dict]:
  """The points of sweep `name`: scaling x learning rate x seed (the length
  sweeps: scaling at its LENGTH_LRS rate x positions x seed, then eval.py
  --lengths; the practice sweeps: staged, see PRACTICE, reading `workdir`)."""
  configlib.check_choice("sweep", name, SWEEPS)
  if name.startswith("practice"):
    return _practice_points(name, workdir)
  if name.startswith("precision"):
    return _precision_points(name)
  if name.startswith("length"):
    preset, lrs, positions, lengths, seeds = SWEEPS[name]
    # Seed-major: after the first half, every (scaling, positions) has one run.
    return [{"arg": f"preset={preset},scaling={scaling},seed={seed}",
             "overrides": {"learning_rate": lr, "model.positions": pos},
             "eval": [lengths, "--length=100"]}
            for seed in seeds for pos in positions for scaling, lr in lrs.items()]
  preset, scalings, learning_rates, seeds = SWEEPS[name]
  return [{"arg": f"preset={preset},scaling={scaling},seed={seed}",
           "overrides": {"learning_rate": lr}}
          for scaling in scalings for lr in learning_rates for seed in seeds]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = configlib.parse_arg(arg, preset="cpu", scaling="standard", p=2.0, temperature=0.0,
                            seed=0)
  configlib.check_choice("preset", arg.preset, PRESETS)

  c = ml_collections.ConfigDict()
  c.task = "char_lm"  # what train.py trains: the task decides data, loss and eval
  # The corpus (attnscale.data.char_lm.DATASETS): tiny_shakespeare_char (65 chars) |
  # wikitext2_char (283 chars: also set --config.model.vocab_size=283).
  c.dataset = "tiny_shakespeare_char"
  c.data_dir = config_dict.placeholder(str)  # TFDS data dir; None = TFDS's default
  c.seed = arg.seed  # one seed for init, data order and dropout: a run is (config, seed)

  # Optimisation.
  c.batch_size = 64  # global batch (sequences), split over all devices
  c.seq_len = 256  # training window length (<= model.block_size)
  c.num_train_steps = 5000  # total optimizer steps
  c.optimizer = "adamw"  # adamw | adam (adam: no weight decay)
  c.learning_rate = 1e-3  # peak learning rate
  c.lr_schedule = "cosine"  # cosine (to min_learning_rate) | constant
  c.warmup_steps = 100  # linear warm-up from 0
  c.min_learning_rate = 1e-4  # end of the cosine decay
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.99  # Adam beta2 (nanoGPT's shakespeare_char uses 0.99)
  c.weight_decay = 0.1  # decoupled, on matrices and embeddings only (nanoGPT)
  c.grad_clip = 1.0  # global-norm clipping; 0 = off

  # Bookkeeping.
  c.log_every = 50  # steps between progress lines / metric writes
  c.eval_every = 250  # steps between validation estimates
  c.eval_batches = 20  # random validation batches per estimate (nanoGPT estimate_loss)
  c.checkpoint_every = 500  # steps between checkpoints (plus one at the end)
  c.keep_checkpoints = 3  # how many recent checkpoints to keep

  # Devices: a data x fsdp mesh over every device of every process (README,
  # "GPUs, TPU pods, several hosts"). The batch is sharded on both axes; params
  # and optimizer state on fsdp (FSDP), replicated over data. -1 = all the rest.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel replicas
  c.mesh.fsdp = 1  # devices each parameter is split over (1 = replicated)
  # Rematerialisation of each block, for models that do not fit: none | full (keep
  # only each block's input) | dots (keep matmul outputs). compile.py shows the saving.
  c.remat = "none"

  # Model (fields of attnscale.models.ModelConfig).
  c.model = ml_collections.ConfigDict()
  m = c.model
  m.vocab_size = 65  # tiny Shakespeare's characters (checked against the data)
  m.block_size = 256  # learned positions = longest sequence
  m.num_layers = 6
  m.num_heads = 6
  m.num_kv_heads = config_dict.placeholder(int)  # None = num_heads; fewer = GQA
  m.width = 384  # d_model
  m.mlp_ratio = 4  # MLP hidden = mlp_ratio * width
  m.dropout = 0.2  # embeddings and residual branches (the fused kernel has no attention dropout)
  configlib.add_attention_fields(m, arg.scaling, p=arg.p, temperature=arg.temperature)  # scaling, variant, ...

  if arg.preset == "graphcore":
    c.batch_size, c.seq_len = 16, 256
    c.optimizer, c.lr_schedule, c.learning_rate = "adam", "constant", 2.0**-10
    c.warmup_steps, c.weight_decay, c.grad_clip, c.b2 = 0, 0.0, 0.0, 0.999
    m.num_layers, m.num_heads, m.width, m.dropout = 4, 4, 256, 0.0
  elif arg.preset == "graphcore_cpu":
    # Graphcore's recipe (Adam, constant LR, no warm-up, dropout or clipping) at
    # a size whose whole sweep runs in about an hour on 2 CPU cores.
    c.batch_size, c.seq_len, c.num_train_steps = 16, 64, 1500
    c.optimizer, c.lr_schedule, c.learning_rate = "adam", "constant", 2.0**-7
    c.warmup_steps, c.weight_decay, c.grad_clip, c.b2 = 0, 0.0, 0.0, 0.999
    c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 20, 500, 10, 500
    m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 64, 4, 4, 64, 0.0
  elif arg.preset == "cpu":
    c.batch_size, c.seq_len, c.num_train_steps = 32, 128, 1000
    c.learning_rate, c.min_learning_rate, c.warmup_steps = 2e-3, 2e-4, 50
    c.eval_every, c.checkpoint_every = 250, 250
    m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 128, 4, 4, 128, 0.0
  elif arg.preset == "test":
    c.batch_size, c.seq_len, c.num_train_steps = 8, 32, 20
    c.learning_rate, c.min_learning_rate, c.warmup_steps = 3e-3, 3e-4, 2
    c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 5, 10, 2, 10
    m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 32, 2, 2, 32, 0.1
  return c
