r"""Evaluates a train.py run over the whole validation split, with per-layer
attention diagnostics; writes WORKDIR/eval.json. The task decides the metrics:
the char LM's loss and bits per character (and a sample), the masked LM's loss,
perplexity and masked-token accuracy (the sampling flags do not apply to it).

  python eval.py --workdir=runs/char_cpu
  python eval.py --workdir=runs/char_cpu --prompt="ROMEO:" --length=500 --temperature=0.8 --top_k=40
  python eval.py --workdir=runs/bert_cpu
  python eval.py --workdir=runs/char_rope --lengths=128,256,512,1024,2048
  python eval.py --workdir=runs/gpt2_small --whole_split

From any folder: `attnscale-eval --workdir=...` (installed by `pip install -e .`);
the run's config.imports are found where training found them (WORKDIR/provenance.json).

In several processes, add train.py's --multihost flags to each
(docs/guides/pods-and-gpus.md); process 0 writes eval.json and prints the summary.

A bad flag exits with one `error: ...` line naming it (attnscale/runtime/cli.py).
"""

# The flags and main: attnscale/commands/eval.py (also the attnscale-eval command).
from attnscale.commands.eval import run

if __name__ == "__main__":
  run()
