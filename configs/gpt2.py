r"""GPT-2 on pre-tokenized shards (OpenWebText, FineWeb-Edu): nanoGPT's / llm.c's 124M and 350M.

Prepare shards once (docs/guides/gpt2.md), then train and evaluate (every field
overridable):

  python -m attnscale.data.prepare_tokens --hf_dataset=fineweb_edu_10b \
      --out=data/fineweb_edu_10b
  python train.py --config=configs/gpt2.py:preset=small --workdir=runs/gpt2_small
  python eval.py --workdir=runs/gpt2_small --whole_split

On this machine's CPU, with shards of tiny Shakespeare's bytes (no network needed):

  python -m attnscale.data.prepare_tokens --input=$ATTNSCALE_DATA/tinyshakespeare \
      --tokenizer=bytes --out=data/shakespeare_bytes
  python train.py --config=configs/gpt2.py:preset=cpu --workdir=runs/gpt2_cpu

A subword LM offline: WikiText-2's articles with an 8192-piece SentencePiece BPE
vocabulary trained on its training split (docs/guides/gpt2.md):

  python -m attnscale.data.prepare_tokens --input=$ATTNSCALE_DATA/wikitext-2 \
      --tokenizer=spm8k --out=data/wikitext2_spm8k
  python train.py --config=configs/gpt2.py:preset=cpu,tokenizer=spm8k --workdir=runs/gpt2_spm8k

Config argument keys: preset (small | medium | cpu | test), scaling (any name of
`attnscale.scalings.names()`, or unit_scaled), p, temperature, s, gamma, a (as
configs/shakespeare_char.py), seed, tokenizer (gpt2 | bytes | spm8k; default: gpt2
for small and medium, bytes for cpu and test), which sets model.vocab_size (50304:
GPT-2's 50257 padded to a multiple of 64, as nanoGPT; bytes: 320; spm8k: 8192) and
the default data_dir (data/fineweb_edu_10b, data/shakespeare_bytes,
data/wikitext2_spm8k). The seeds' experiments at 124M: configs/gpt2_sweeps.py.

Presets and what to expect:
  small   GPT-2 124M (12 layers, 12 heads, width 768, block 1024), nanoGPT's AdamW
          recipe (6e-4, cosine to 6e-5, betas 0.9/0.95, weight decay 0.1, clip 1.0,
          no dropout) with llm.c's warm-up of 700 steps, bfloat16 compute, 512 x 1024 = 524,288 tokens
          a step in 8 micro-batches, 19,073 steps = 10B tokens: llm.c's 124M run, which
          reached 3.28 validation loss on FineWeb (not -Edu; the target of
          modded-nanogpt's speedrun). Not run here: docs/guides/gpt2.md says what was
          verified.
  medium  GPT-2 350M (24 layers, 16 heads, width 1024), 3e-4 (GPT-3's 350M rate),
          the same batch and tokens in 16 micro-batches.
  cpu     4 layers, width 128, 4 heads, block 128, batch 32, 1000 steps: minutes on
          2 CPU cores on tiny Shakespeare's bytes.
  test    seconds: for the test suite.
"""

import ml_collections

from attnscale.config import builders

PRESETS = ("small", "medium", "cpu", "test")
# tokenizer -> (model.vocab_size, the default data_dir): what prepare_tokens writes there.
# Each vocabulary rounded up to a multiple of 64 (nanoGPT's padding, for speed).
TOKENIZERS = {"gpt2": (50304, "data/fineweb_edu_10b"), "bytes": (320, "data/shakespeare_bytes"),
              "spm8k": (8192, "data/wikitext2_spm8k")}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = builders.parse_arg(arg, preset="small", scaling="standard", p=2.0, temperature=0.0,
                            s=0.0, gamma=1.0, a=0.0, seed=0, tokenizer="")
  builders.check_choice("preset", arg.preset, PRESETS)
  tokenizer = arg.tokenizer or ("gpt2" if arg.preset in ("small", "medium") else "bytes")
  builders.check_choice("tokenizer", tokenizer, TOKENIZERS)
  vocab_size, data_dir = TOKENIZERS[tokenizer]

  c = ml_collections.ConfigDict()
  c.task = "token_lm"  # next-token prediction on pre-tokenized shards (attnscale/tasks/token_lm.py)
  # The shards' format: auto (each file's header says) | nanogpt (train.bin, val.bin,
  # headerless uint16) | llmc (llm.c's / modded-nanogpt's *_train_*.bin, *_val_*.bin).
  c.dataset = "auto"
  # The folder of token shards (python -m attnscale.data.prepare_tokens --out=...).
  c.data_dir = data_dir
  c.seed = arg.seed  # one seed for init, data order and dropout: a run is (config, seed)
  c.imports = ()  # your own scalings, model variants or tasks (configs/shakespeare_char.py)

  # Optimisation: nanoGPT's train_gpt2.py / llm.c's GPT-2 124M recipe.
  c.batch_size = 512  # global batch (sequences), split over all devices
  c.seq_len = 1024  # training window length (<= model.block_size)
  c.num_train_steps = 19073  # total optimizer steps (10B tokens at 524,288 a step)
  # optimizer (adamw), its Muon options, learning_rate and lr_schedule (cosine)
  builders.add_optimizer(c, learning_rate=6e-4)
  c.warmup_steps = 700  # linear warm-up from 0 (llm.c's 124M run)
  c.min_learning_rate = 6e-5  # end of the cosine decay (a tenth of the peak, nanoGPT)
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.95  # Adam beta2
  c.weight_decay = 0.1  # decoupled, on matrices and embeddings only (nanoGPT)
  c.grad_clip = 1.0  # global-norm clipping; 0 = off

  # Bookkeeping.
  c.log_every = 10  # steps between progress lines / metric writes
  c.eval_every = 250  # steps between validation estimates
  c.eval_batches = 20  # fixed validation batches per estimate (llm.c: 20 steps)
  # Validation targets eval.py scores: the split's first N (modded-nanogpt's 10,485,760);
  # 0 = the whole split (also eval.py --whole_split).
  c.eval_tokens = 10_485_760
  c.checkpoint_every = 1000  # steps between checkpoints (plus one at the end)
  c.keep_checkpoints = 3  # how many recent checkpoints to keep

  builders.add_devices(c)  # mesh, remat, grad_accum_steps, loggers, profile_steps, label
  builders.add_attention_health(c)  # attn_metrics, qk_clip, sink_metrics_rows, z_loss
  # The sink metrics' pass holds [rows, heads, T, T] weights a layer: 2 rows at T = 1024
  # are 100 MB a layer (8 would be 400 MB).
  c.sink_metrics_rows = 2
  # Micro-batches a step: 8 of 64 rows (8 rows a device on 8 devices) fit a v5e chip's
  # 16 GiB (compile.py); on 64 or more chips, --config.grad_accum_steps=1.
  c.grad_accum_steps = 8

  # Model: GPT-2 small (nanoGPT's GPTConfig: tied embedding, learned positions, pre-LN,
  # GELU MLP x4), with the config argument's scaling.
  c.model = builders.model(arg.scaling, p=arg.p, temperature=arg.temperature, s=arg.s,
                            gamma=arg.gamma, a=arg.a)
  m = c.model
  m.vocab_size, m.block_size = vocab_size, 1024
  m.num_layers, m.num_heads, m.width, m.dropout = 12, 12, 768, 0.0
  # Mixed precision, as nanoGPT's and llm.c's runs (and what cuDNN's flash attention takes);
  # parameters, softmax and loss stay float32 (docs/guides/low-precision.md).
  m.dtype = "bfloat16"

  if arg.preset == "medium":
    c.learning_rate, c.min_learning_rate, c.grad_accum_steps = 3e-4, 3e-5, 16
    m.num_layers, m.num_heads, m.width = 24, 16, 1024
  elif arg.preset == "cpu":
    c.batch_size, c.seq_len, c.num_train_steps, c.grad_accum_steps = 32, 128, 1000, 1
    c.learning_rate, c.min_learning_rate, c.warmup_steps, c.b2 = 2e-3, 2e-4, 50, 0.99
    c.log_every, c.eval_every, c.checkpoint_every, c.eval_tokens = 50, 250, 250, 0
    m.block_size, m.num_layers, m.num_heads, m.width, m.dtype = 128, 4, 4, 128, "float32"
  elif arg.preset == "test":
    c.batch_size, c.seq_len, c.num_train_steps, c.grad_accum_steps = 8, 32, 20, 2
    c.learning_rate, c.min_learning_rate, c.warmup_steps, c.b2 = 3e-3, 3e-4, 2, 0.99
    c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 5, 10, 2, 10
    c.eval_tokens = 2048
    m.block_size, m.num_layers, m.num_heads, m.width, m.dtype = 32, 2, 2, 32, "float32"
  return c
