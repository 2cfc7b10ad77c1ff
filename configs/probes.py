r"""The synthetic probes: tasks where the sink and length mechanisms must differ.

Launch (any scaling from `attnscale.scalings.names()`; every field overridable):

  python train.py --config=configs/probes.py:preset=trigger_cpu --workdir=runs/trigger
  python train.py --config=configs/probes.py:preset=trigger_cpu \
      --config.model.normalizer=relu --workdir=runs/trigger_relu
  python eval.py --workdir=runs/trigger
  python train.py --config=configs/probes.py:preset=mqar_cpu --workdir=runs/mqar
  python eval.py --workdir=runs/mqar --lengths=64,128,256,512,1024

Config argument keys: preset (TASK_SIZE: trigger_cpu | trigger_test | mqar_cpu |
mqar_test | mqar_gpu | max_retrieval_cpu | max_retrieval_test | max_retrieval_gpu), scaling, p, temperature, s,
gamma, a and seed, as configs/shakespeare_char.py's, and gain: with a QK-norm
scaling (qk_rmsnorm, qk_layernorm), its logits' fixed multiplier g (logits =
g RMSNorm(q) . RMSNorm(k) / sqrt(d): the "QK-norm gain" peers' record runs raised
from about 1.5 to about 5); 0 = none (g = 1).

The tasks (attnscale/tasks/trigger.py, mqar.py, max_retrieval.py, each with its
source and where it departs from it) generate their examples from the seed on the
fly, the same for every label at a seed; their arguments are `config.probe`
(docs/reference/config.md). eval.json holds exact-match accuracy beside the loss,
and per layer and head the sink measures on each task's query groups (the trigger
task's trigger and no-trigger rows).

Presets and what to expect (measured: docs/experiments/probes.md, a pilot):
  trigger_cpu  2 layers, 2 heads, width 64, rows of 64, batch 32, 1500 steps of
            AdamW at 2^-7: a few minutes on 2 CPU cores. Softmax should put its
            no-trigger rows' weight on BOS (first-key weight far above 1/n), ReLU
            attention (model.normalizer=relu) should not (arXiv 2603.11487).
  mqar_cpu  Zoology's MQAR at vocabulary 160, 4 pairs in rows of 64, 2 layers,
            2 heads, width 64, rotary positions, batch 64, 3000 steps at 2^-8 (about
            5 minutes alone on 2 cores); train at 64, evaluate at up to 16x
            (eval.py --lengths; pairs grown and fixed). Recall has not formed by
            then in the pilot (docs/experiments/probes.md).
  max_retrieval_cpu  the running max over up to 16 items (rows of 32) of 256
            priorities, 8 labels; rotary; evaluate up to 16x (256 items). Not
            solved in distribution in the pilot (accuracy 0.39).
  mqar_gpu, max_retrieval_gpu  the length tasks at Zoology's vocabulary (8192, 64
            pairs in rows of 256) and with 2048 priorities in rows of 64, width 128,
            batch 256, 20,000 steps: for a GPU (benchmarks/gpu_session.sh `probes`),
            evaluated to 16x; not run on a chip yet.
  *_test    seconds: for the test suite.
"""

import dataclasses

import ml_collections

from attnscale import tasks
from attnscale.config import builders

TASKS = ("trigger", "mqar", "max_retrieval")
# The length tasks at Zoology's and the paper's sizes, for a GPU (benchmarks/gpu_session.sh).
GPU_PRESETS = ("mqar_gpu", "max_retrieval_gpu")
PRESETS = tuple(f"{t}_{size}" for t in TASKS for size in ("cpu", "test")) + GPU_PRESETS
QK_NORM_SCALINGS = ("qk_rmsnorm", "qk_layernorm")  # the scalings the `gain` argument takes


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = builders.parse_arg(arg, preset="trigger_cpu", scaling="standard", p=2.0,
                            temperature=0.0, s=0.0, gamma=1.0, a=0.0, gain=0.0, seed=0)
  builders.check_choice("preset", arg.preset, PRESETS)
  if arg.gain and arg.scaling not in QK_NORM_SCALINGS:
    raise ValueError(f"config argument gain={arg.gain:g} needs a QK-norm scaling (one of "
                     f"{list(QK_NORM_SCALINGS)}), got scaling={arg.scaling}")
  task, size = arg.preset.rsplit("_", 1)

  c = ml_collections.ConfigDict()
  c.task = task  # trigger | mqar | max_retrieval (the preset's): attnscale/tasks/
  c.dataset = "generated"  # the examples are generated from the seed: the one value
  # The task's arguments at their defaults (its Args dataclass, attnscale/tasks/<task>.py,
  # documents each); the preset sets what differs.
  c.probe = ml_collections.ConfigDict(dataclasses.asdict(tasks.TASKS[task].ARGS()))
  c.seed = arg.seed  # one seed for init and the generated examples: a run is (config, seed)
  # Your own scalings, model variants or tasks: module names or .py paths imported
  # before the config is checked.
  c.imports = ()

  # Optimisation.
  c.batch_size = 32  # global batch (rows), split over all devices
  c.seq_len = 64  # training row length (<= model.block_size)
  c.num_train_steps = 1500  # total optimizer steps
  # optimizer (adamw), its Muon options, learning_rate and lr_schedule (cosine)
  builders.add_optimizer(c, learning_rate=2.0**-7)
  c.warmup_steps = 100  # linear warm-up from 0
  c.min_learning_rate = 2.0**-10  # end of the cosine decay
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.99  # Adam beta2
  c.weight_decay = 0.0  # decoupled, on matrices and embeddings only
  c.grad_clip = 1.0  # global-norm clipping; 0 = off

  # Bookkeeping.
  c.log_every = 50  # steps between progress lines / metric writes
  c.eval_every = 500  # steps between validation estimates
  c.eval_batches = 8  # generated validation batches per estimate
  c.checkpoint_every = 500  # steps between checkpoints (plus one at the end)
  c.keep_checkpoints = 2  # how many recent checkpoints to keep

  builders.add_devices(c)  # config.mesh (data x fsdp) and config.remat
  builders.add_attention_health(c)  # attn_metrics, qk_clip, sink_metrics_rows, z_loss

  c.model = builders.model(arg.scaling, p=arg.p, temperature=arg.temperature, s=arg.s,
                            gamma=arg.gamma, a=arg.a)
  m = c.model
  if arg.gain:
    m.scaling_params = {"mult": float(arg.gain)}
  m.block_size, m.num_layers, m.num_heads, m.width, m.dropout = 64, 2, 2, 64, 0.0
  if task == "trigger":
    c.probe.num_values = 8
    m.vocab_size = 3 + c.probe.num_values
  elif task == "mqar":
    # 4 pairs in rows of 64; 160 tokens hold the 64 distinct keys of 16x with the pairs
    # grown. Recall forms late (Zoology trains ~50x more examples): twice the rows and
    # steps of the other probes, at 2^-8.
    c.probe.vocab_size, c.probe.num_pairs = 160, 4
    c.batch_size, c.num_train_steps, c.learning_rate = 64, 3000, 2.0**-8
    m.vocab_size = c.probe.vocab_size
    m.positions = "rope"  # so that eval.py --lengths can run it at up to 16x
  else:
    c.seq_len = m.block_size = 32
    c.probe.num_priorities, c.probe.num_labels = 256, 8
    m.vocab_size = c.probe.num_priorities + c.probe.num_labels
    m.positions = "rope"

  if size == "gpu":
    # MQAR at Zoology's vocabulary and densest rows (4 N = T: 64 pairs in 256 tokens;
    # at 16 x, 4096 tokens and 1024 pairs grown, within the 4095 keys of [1, V/2)),
    # width 128, batch 256: 5.1M training rows (Zoology trains 100k x 64 epochs).
    # Max retrieval over up to 32 items of 2048 priorities (16 x: 512 items).
    m.width, c.batch_size, c.num_train_steps, c.warmup_steps = 128, 256, 20_000, 500
    c.log_every, c.eval_every, c.checkpoint_every = 200, 2_000, 5_000
    if task == "mqar":
      c.seq_len = m.block_size = 256
      c.probe.vocab_size, c.probe.num_pairs = 8192, 64
      m.vocab_size, c.learning_rate = c.probe.vocab_size, 2.0**-9
    else:
      c.seq_len = m.block_size = 64
      c.probe.num_priorities = 2048
      m.vocab_size = c.probe.num_priorities + c.probe.num_labels
  if size == "test":
    c.batch_size, c.num_train_steps, c.warmup_steps = 8, 20, 2
    c.log_every, c.eval_every, c.eval_batches, c.checkpoint_every = 5, 10, 2, 10
    c.probe.eval_examples = 16
    c.seq_len = m.block_size = 16
    m.width = 32
    if task == "mqar":
      c.probe.vocab_size, c.probe.num_pairs = 64, 2
      m.vocab_size = c.probe.vocab_size
    elif task == "max_retrieval":
      c.probe.num_priorities = 64
      m.vocab_size = c.probe.num_priorities + c.probe.num_labels
  return c
