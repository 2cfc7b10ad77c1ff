r"""Character-level language model on tiny Shakespeare: nanoGPT's shakespeare_char in JAX.

Launch (any scaling from `attnscale.scalings.names()`; every field overridable):

  python train.py --config=configs/shakespeare_char.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/char_cpu_key_norm_sum
  python eval.py --workdir=runs/char_cpu_key_norm_sum
  python train.py --config=configs/shakespeare_char.py:preset=nanogpt --workdir=runs/nanogpt \
      --config.num_train_steps=2000

Config argument keys: preset (nanogpt | nanogpt_cpu | graphcore | graphcore_cpu | cpu | test), scaling, p (the
power for scaling=key_norm_power), temperature (scaling=cosine with this fixed temperature
instead of the learned one; 0 = learned), s (scaling=log_n with this fixed s: critical
log-n scaling; 0 = learned), gamma and a (the length laws: scaling=log_n_power's gamma
and p, scaling=n_power's gamma and exponent a; docs/experiments/critical_length.md), seed. scaling=unit_scaled selects the
unit-scaled, residual-weighted transformer (model.variant=unit) with fully scaled
attention and Graphcore's relative attention weight.

Presets and what to expect:
  nanogpt   nanoGPT's config/train_shakespeare_char.py exactly (6 layers, 6 heads,
            width 384, block 256, batch 64, dropout 0.2, AdamW 1e-3 cosine to 1e-4,
            warm-up 100, beta2 0.99, clip 1.0, 5000 steps). nanoGPT reports a best
            validation loss of 1.4697. A GPU job (minutes on one GPU).
  nanogpt_cpu  nanoGPT's CPU recipe exactly as its README gives it (4 layers, 4
            heads, width 128, block 64, batch 12, 2000 steps, no dropout, 20-batch
            estimates). nanoGPT reports 1.88; measured here: docs/getting-started.md.
  graphcore Graphcore's almost-scaled-attention demo: 4 layers, width 256, 4 heads,
            seq 256, batch 16, Adam, constant LR, no warm-up, no dropout, 5000
            steps; sweep LR over 2^-7 ... 2^-12. Graphcore (byte-level complete
            works) report baseline about 1.2, fully scaled about 1.4.
  graphcore_cpu  Graphcore's recipe at 4 layers, width 64, seq 64, batch 16,
            1500 steps: the CPU learning-rate sweep ("graphcore_cpu" in
            configs/shakespeare_char_sweeps.py).
  cpu       4 layers, width 128, 4 heads, seq 128, batch 32, 1000 steps: a
            useful model in minutes on 2 CPU cores (docs/getting-started.md).
  test      seconds: for the test suite.
"""

import ml_collections
from ml_collections import config_dict

from attnscale.config import builders

PRESETS = ("nanogpt", "nanogpt_cpu", "graphcore", "graphcore_cpu", "cpu", "test")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = builders.parse_arg(arg, preset="cpu", scaling="standard", p=2.0, temperature=0.0,
                            s=0.0, gamma=1.0, a=0.0, seed=0)
  builders.check_choice("preset", arg.preset, PRESETS)

  c = ml_collections.ConfigDict()
  c.task = "char_lm"  # what train.py trains: the task decides data, loss and eval
  # The corpus (attnscale.data.char_lm.DATASETS): tiny_shakespeare_char (65 chars) |
  # wikitext2_char (283 chars: also set --config.model.vocab_size=283).
  c.dataset = "tiny_shakespeare_char"
  c.data_dir = config_dict.placeholder(str)  # TFDS data dir; None = TFDS's default
  c.seed = arg.seed  # one seed for init, data order and dropout: a run is (config, seed)
  # Your own scalings, model variants or tasks: module names or .py paths imported
  # before the config is checked, e.g. --config.imports='("my_scalings",)'. Saved in
  # config.json, so eval.py and the studies import them too.
  c.imports = ()

  # Optimisation.
  c.batch_size = 64  # global batch (sequences), split over all devices
  c.seq_len = 256  # training window length (<= model.block_size)
  c.num_train_steps = 5000  # total optimizer steps
  # optimizer (adamw), its Muon options, learning_rate and lr_schedule (cosine)
  builders.add_optimizer(c, learning_rate=1e-3)
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

  builders.add_devices(c)  # mesh, remat, grad_accum_steps, loggers, profile_steps, label
  builders.add_attention_health(c)  # attn_metrics, qk_clip, sink_metrics_rows, z_loss

  # Model: attnscale.models.ModelConfig's fields (docs/reference/config.md), whose
  # defaults are nanoGPT's shakespeare_char model (65 characters, 6 layers, 6 heads,
  # width 384, block 256), with the config argument's scaling. What differs here:
  c.model = builders.model(arg.scaling, p=arg.p, temperature=arg.temperature, s=arg.s,
                            gamma=arg.gamma, a=arg.a)
  m = c.model
  m.dropout = 0.2  # nanoGPT's shakespeare_char (the smaller presets below set their own)

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
  elif arg.preset == "nanogpt_cpu":
    # nanoGPT's CPU recipe, its README's command over train_shakespeare_char.py:
    # --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4
    # --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
    # (the rest as nanogpt above). nanoGPT reports a validation loss of 1.88.
    c.batch_size, c.seq_len, c.num_train_steps = 12, 64, 2000
    c.log_every, c.eval_every, c.eval_batches = 1, 250, 20
    c.attn_metrics = False  # nanoGPT's step computes no attention statistics: a like wall time
    c.sink_metrics_rows = 0
    m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 64, 4, 4, 128, 0.0
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
