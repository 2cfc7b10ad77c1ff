r"""Evaluates a train.py run over the whole validation split, with per-layer
attention diagnostics; writes WORKDIR/eval.json. The task decides the metrics:
the char LM's loss and bits per character (and a sample), the masked LM's loss,
perplexity and masked-token accuracy (the sampling flags do not apply to it).

  python eval.py --workdir=runs/char_cpu
  python eval.py --workdir=runs/char_cpu --prompt="ROMEO:" --length=500 --temperature=0.8 --top_k=40
  python eval.py --workdir=runs/bert_cpu
  python eval.py --workdir=runs/char_rope --lengths=128,256,512,1024,2048
  python eval.py --workdir=runs/gpt2_small --whole_split

In several processes, add train.py's --multihost flags to each
(docs/guides/pods-and-gpus.md); process 0 writes eval.json and prints the summary.

A bad flag exits with one `error: ...` line naming it (attnscale/runtime/cli.py).
"""

import sys

from absl import app, flags, logging

from attnscale.runtime import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A train.py run directory.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest that "
                             "can be read; a damaged newer one gets a warning line).")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Sampling prompt.")
_LENGTH = flags.DEFINE_integer("length", 300, "Characters to sample.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Sampling temperature.")
_TOP_K = flags.DEFINE_integer("top_k", 200, "Sample from the top k tokens (0 = all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_LENGTHS = flags.DEFINE_string(
    "lengths", None, "Comma-separated context lengths, e.g. 128,256,512,1024,2048: the "
    "validation loss at each and by position in the window (eval.json 'lengths').")
_WHOLE_SPLIT = flags.DEFINE_bool(
    "whole_split", False, "Score the whole validation split where the config scores only its "
    "first config.eval_tokens targets (the token LM, configs/gpt2.py).")
_MULTIHOST = cli.define_multihost_flags()  # as train.py's: one of several processes
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  cli.check_workdir(_WORKDIR.value)
  logging.set_verbosity(logging.WARNING)
  cli.initialize_multihost(_MULTIHOST)  # before anything starts JAX's backend
  from attnscale.evaluation import eval_lib, length_eval
  try:
    lengths = length_eval.parse_lengths(_LENGTHS.value) if _LENGTHS.value else None
    result = eval_lib.evaluate_run(_WORKDIR.value, step=_STEP.value, prompt=_PROMPT.value,
                                   sample_length=_LENGTH.value,
                                   temperature=_TEMPERATURE.value, top_k=_TOP_K.value or None,
                                   seed=_SEED.value, lengths=lengths,
                                   whole_split=_WHOLE_SPLIT.value)
  except (ValueError, FileNotFoundError) as e:
    cli.fail(str(e))
  import jax
  if jax.process_index() == 0:
    print(eval_lib.format_summary(result))


if __name__ == "__main__":
  from attnscale.runtime import hostmem
  try:
    hostmem.reexec_with_tunables()  # 1.3-2x faster steps on CPU: attnscale/runtime/hostmem.py
  except ValueError as e:  # a bad ATTNSCALE_MALLOC
    sys.exit(f"error: {e}")
  app.run(main, flags_parser=cli.parse_flags)
