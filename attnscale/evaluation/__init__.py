"""Evaluating trained runs: eval.py's library.

    eval_lib.py     whole-split metrics, samples, eval.json
    length_eval.py  loss at each context length and by position
    diagnostics.py  per-layer attention statistics (entropy, max logit, sinks)

May import core, numerics, models, data, tasks, config and runtime.
"""
