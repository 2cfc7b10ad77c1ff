r"""Small BERT: masked-LM pretraining on WikiText-2 that compares attention scalings.

Launch (any scaling from `attnscale.scalings.names()`, or unit_scaled; every
field overridable):

  python train.py --config=configs/bert_small.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/bert_cpu_key_norm_sum
  python eval.py --workdir=runs/bert_cpu_key_norm_sum
  python train.py --config=configs/bert_small.py:preset=mini,ln=pre --workdir=runs/bert_mini_pre

Config argument keys: preset (mini | cpu | base | test), scaling, p (the power for
scaling=key_norm_power), seed, ln (post = original BERT | pre). scaling=unit_scaled
selects the unit-scaled, residual-weighted transformer (model.variant=unit) with
fully scaled attention and Graphcore's relative attention weight, exactly as
configs/shakespeare_char.py does; that variant is pre-LN with a tied unit-scaled
readout (no BERT MLM head).

The task: a bidirectional encoder over [CLS] ... [SEP] [PAD]... rows of WikiText
paragraphs (32% of the positions are padding at seq 128), a SentencePiece BPE
vocabulary of 8192 (2048 at the cpu preset) with BERT's specials trained from the train split when the
data is prepared, 15% of the real tokens selected per row and 80/10/10
[MASK]/random/kept, redrawn every step. Padded keys are masked out of every
scaling (their norms and their count). The MLM head runs on the selected
positions only (max_predictions_per_seq slots a row). The scalings' sweep:
configs/bert_small_sweeps.py. eval.py reports the MLM loss,
perplexity and masked-token accuracy over the whole validation split.

Presets and what to expect:
  mini  BERT-mini's shape (Turc et al. 2019): 4 layers, width 256, 4 heads, seq
        128; batch 128, 10k steps, AdamW 5e-4 (warm-up 500, cosine), dropout
        0.1. A GPU job; not yet measured.
  cpu   4 layers, width 128, 4 heads, seq 128, rotary positions, batch 32, 1000
        steps of AdamW 3e-3 (warm-up 100, cosine to 1e-4), no dropout, on
        WikiText-2 with a 2048-piece vocabulary (dataset wikitext2_2k): a few
        minutes on 2 quiet CPU cores. Measured figures (loss, masked-token
        accuracy, time and load): docs/guides/masked-lm.md.
  base  BERT-base's shape (12 x 768, 12 heads, seq 512, batch 256) on
        WikiText-103: a pod job (compile.py --target=tpu-v5e-8 or gpu-h100x8,
        docs/guides/pods-and-gpus.md).
  test  seconds: for the test suite.
"""

import ml_collections
from ml_collections import config_dict

from attnscale.config import builders

PRESETS = ("mini", "cpu", "base", "test")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = builders.parse_arg(arg, preset="cpu", scaling="standard", p=2.0, seed=0, ln="post")
  builders.check_choice("preset", arg.preset, PRESETS)
  builders.check_choice("ln", arg.ln, ("post", "pre"))

  c = ml_collections.ConfigDict()
  c.task = "mlm"  # what train.py trains: masked-LM pretraining (attnscale.tasks.MLMTask)
  c.dataset = "wikitext2"  # wikitext2 | wikitext2_2k | wikitext103 (MLMTask.DATASETS)
  c.data_dir = config_dict.placeholder(str)  # TFDS data dir; None = TFDS's default
  c.seed = arg.seed  # one seed for init, data order, masking and dropout
  # Your own scalings, model variants or tasks: module names or .py paths imported
  # before the config is checked, e.g. --config.imports='("my_scalings",)'. Saved in
  # config.json, so eval.py and the studies import them too.
  c.imports = ()

  # Masked LM (Devlin et al. 2019), redrawn each step from (seed, step).
  c.mask_rate = 0.15  # fraction of each row's real tokens selected for prediction
  c.mask_token_rate = 0.8  # of those: replaced by [MASK]
  c.random_token_rate = 0.1  # replaced by a random real token (the rest stay as they are)
  # BERT's max_predictions_per_seq: prediction slots P per row (at most P tokens of
  # a row are selected); the MLM head runs on these P gathered positions only, not
  # on all seq_len. None = ceil(mask_rate * (seq_len - 2)): 19 at 128, 77 at 512.
  c.max_predictions_per_seq = config_dict.placeholder(int)

  # Optimisation.
  c.batch_size = 128  # global batch (rows), split over all devices
  c.seq_len = 128  # row length including [CLS] and [SEP] (<= model.block_size)
  c.num_train_steps = 10_000  # total optimizer steps
  # optimizer (adamw), its Muon options, learning_rate and lr_schedule (cosine)
  builders.add_optimizer(c, learning_rate=5e-4)
  c.warmup_steps = 500  # linear warm-up from 0 (post-LN needs one)
  c.min_learning_rate = 5e-5  # end of the cosine decay
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.98  # Adam beta2 (RoBERTa's, steadier than 0.999 for short runs)
  c.weight_decay = 0.01  # BERT's, on matrices and embeddings only
  c.grad_clip = 1.0  # global-norm clipping; 0 = off

  # Bookkeeping.
  c.log_every = 50  # steps between progress lines / metric writes
  c.eval_every = 500  # steps between validation estimates
  c.eval_batches = 10  # random masked validation batches per estimate (fixed seed)
  c.checkpoint_every = 1000  # steps between checkpoints (plus one at the end)
  c.keep_checkpoints = 3  # how many recent checkpoints to keep

  builders.add_devices(c)  # mesh, remat, grad_accum_steps, loggers, profile_steps, label
  builders.add_attention_health(c)  # attn_metrics, qk_clip, sink_metrics_rows, z_loss

  # Model: attnscale.models.ModelConfig's fields (docs/reference/config.md) with the
  # config argument's scaling. What differs from its defaults (a GPT):
  c.model = builders.model(arg.scaling, p=arg.p)
  m = c.model
  m.vocab_size = 8192  # the subword vocabulary (checked against the tokenizer)
  m.block_size = 128  # learned positions = longest row
  m.num_layers, m.num_heads, m.width = 4, 4, 256  # BERT-mini's shape (Turc et al. 2019)
  m.dropout = 0.1  # BERT's, on embeddings and residual branches
  m.causal = False  # bidirectional: every real token sees every real token
  m.ln_position = arg.ln  # post: LN(x + f(x)) as BERT | pre: x + f(LN(x))
  m.head = "mlm"  # BERT's MLM head: dense + GELU + LN, tied embedding, output bias
  if m.variant == "unit":
    # The unit-scaled transformer is pre-LN with a tied readout; its attention
    # weight uses n = block_size (bidirectional).
    m.ln_position, m.head = "pre", "lm"

  if arg.preset == "cpu":
    # Tuned to leave the unigram within minutes on 2 cores (docs/guides/masked-lm.md).
    # Rotary positions: with learned positions (N(0, 0.02), LayerNorm-ed with the
    # token) the encoder sat at the unigram loss for the first 300 steps (probe:
    # val 6.26 at step 150 and 300, unigram 6.23); with rope, attention to the
    # neighbours is there from step 0 and val fell to 6.08 / 5.57 / 5.08 at steps
    # 100 / 200 / 300 (3e-3). A 2048-piece vocabulary: a quarter of the embedding
    # (1.07M parameters in all) and shorter, more predictable pieces. Width 128,
    # batch 32, seq 128 as before. Steps: a 400-step probe ended at val 4.87 and
    # 23% masked-token accuracy (eval.py), so 1000 steps at 3e-3 for >= 30%,
    # still under 10 minutes on quiet cores.
    c.dataset, m.vocab_size, m.positions = "wikitext2_2k", 2048, "rope"
    c.batch_size, c.num_train_steps = 32, 1000
    c.learning_rate, c.min_learning_rate, c.warmup_steps = 3e-3, 1e-4, 100
    c.eval_every, c.checkpoint_every, c.log_every = 250, 250, 50
    m.width, m.dropout = 128, 0.0
  elif arg.preset == "base":
    # BERT-base's shape (Devlin et al. 2019): 12 x 768, 12 heads, seq 512, on
    # WikiText-103 (its 8192-piece vocabulary, not BERT's 30522 WordPiece); BERT's
    # batch 256 and its 1e-4 with 10k warm-up steps. A pod job: compile.py checks
    # that it compiles and fits (docs/guides/pods-and-gpus.md).
    c.dataset = "wikitext103"
    c.batch_size, c.seq_len, c.num_train_steps = 256, 512, 100_000
    c.learning_rate, c.min_learning_rate, c.warmup_steps = 1e-4, 1e-5, 10_000
    c.eval_every, c.checkpoint_every, c.log_every = 5000, 5000, 100
    m.block_size, m.num_layers, m.num_heads, m.width = 512, 12, 12, 768
  elif arg.preset == "test":
    c.batch_size, c.seq_len, c.num_train_steps = 8, 32, 20
    c.learning_rate, c.min_learning_rate, c.warmup_steps = 3e-3, 3e-4, 2
    c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 5, 10, 2, 10
    m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 32, 2, 2, 32, 0.1
  return c
