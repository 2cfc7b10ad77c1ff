r"""Draws runs side by side from their metrics.jsonl: a PNG of their training and
validation curves and a table of their final numbers.

  python compare.py runs/char_cpu runs/char_cosine
  python compare.py runs/my_sweep --out=sweep.png         # a sweep folder: all its runs
  python compare.py runs/a runs/b --attention_layer=-1    # + the last layer's max logit, entropy
  attnscale-compare runs/a runs/b                         # the same, from any folder

Labels come from each run's config (the scaling and the options that change
attention; runs that share one get the fields in which they differ). A bad path
exits with one `error: ...` line.
"""

# The flags and main: attnscale/commands/compare.py (also the attnscale-compare command).
from attnscale.commands.compare import run

if __name__ == "__main__":
  run()
