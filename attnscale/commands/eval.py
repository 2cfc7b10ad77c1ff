r"""attnscale-eval: evaluates a run over the whole validation split, with per-layer
attention diagnostics; writes WORKDIR/eval.json.

  attnscale-eval --workdir=runs/char_cpu
  attnscale-eval --workdir=runs/char_cpu --prompt="ROMEO:" --length=500 --top_k=40
  attnscale-eval --workdir=runs/char_rope --lengths=128,256,512,1024,2048

The same command as `python eval.py ...` at the repository root (eval.py's
docstring says more). The run's config.imports are imported as training imported
them, from any folder: by name, else from the file recorded in
WORKDIR/provenance.json (`eval_lib.load_config`).
"""

import functools
import types

from absl import app, flags, logging

from attnscale.runtime import cli


def define_flags() -> types.SimpleNamespace:
  """Defines the command's flags (absl's global FLAGS); returns their holders."""
  holders = types.SimpleNamespace(
      workdir=flags.DEFINE_string("workdir", None, "A train.py run directory."),
      step=flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest that "
                                "can be read; a damaged newer one gets a warning line)."),
      prompt=flags.DEFINE_string("prompt", "\n", "Sampling prompt."),
      length=flags.DEFINE_integer("length", 300, "Characters to sample."),
      temperature=flags.DEFINE_float("temperature", 0.8, "Sampling temperature."),
      top_k=flags.DEFINE_integer("top_k", 200, "Sample from the top k tokens (0 = all)."),
      seed=flags.DEFINE_integer("seed", 0, "Sampling seed."),
      lengths=flags.DEFINE_string(
          "lengths", None, "Comma-separated context lengths, e.g. 128,256,512,1024,2048: the "
          "validation loss at each and by position in the window (eval.json 'lengths')."),
      whole_split=flags.DEFINE_bool(
          "whole_split", False, "Score the whole validation split where the config scores "
          "only its first config.eval_tokens targets (the token LM, configs/gpt2.py)."),
      data_progress=cli.define_data_progress_flag(),
      multihost=cli.define_multihost_flags())  # as train's: one of several processes
  flags.mark_flag_as_required("workdir")
  return holders


def main(holders: types.SimpleNamespace, argv: list[str]) -> None:
  """Evaluates the run in `holders.workdir` and prints the summary (process 0)."""
  del argv
  h = holders
  cli.check_workdir(h.workdir.value)
  cli.set_data_progress(h.data_progress)
  logging.set_verbosity(logging.WARNING)
  cli.initialize_multihost(h.multihost)  # before anything starts JAX's backend
  from attnscale.evaluation import eval_lib, length_eval
  try:
    lengths = length_eval.parse_lengths(h.lengths.value) if h.lengths.value else None
    config = eval_lib.load_config(h.workdir.value)  # read once: evaluation and summary
    result = eval_lib.evaluate_run(h.workdir.value, config=config, step=h.step.value,
                                   prompt=h.prompt.value,
                                   sample_length=h.length.value,
                                   temperature=h.temperature.value, top_k=h.top_k.value or None,
                                   seed=h.seed.value, lengths=lengths,
                                   whole_split=h.whole_split.value)
  except (ValueError, FileNotFoundError) as e:
    cli.fail(str(e))
  import jax
  if jax.process_index() == 0:
    print(eval_lib.format_summary(result, config))


def run() -> None:
  """The command line (attnscale-eval, eval.py): re-executes with the malloc
  tunables first, then parses the flags and evaluates."""
  cli.reexec_with_tunables()
  holders = define_flags()
  cli.set_help(__doc__, __name__)
  app.run(functools.partial(main, holders), flags_parser=cli.parse_flags)
