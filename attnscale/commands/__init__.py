"""The command lines: attnscale-train, -eval, -sweep, -compile and -compare.

Each module defines its flags and a `run()` that parses them and calls the
library; `pip install -e .` installs `run` as a console command
(`[project.scripts]` in pyproject.toml), and the scripts at the repository root
(train.py, eval.py, sweep.py, compile.py, compare.py) call the same `run`. The top layer: it
may import every package below it, and nothing in attnscale imports it.

    train.py    attnscale-train: train a config, resuming from the run's checkpoint
    eval.py     attnscale-eval: evaluate a run directory (writes WORKDIR/eval.json)
    sweep.py    attnscale-sweep: a config's sweep, its results table and figures
    compile.py  attnscale-compile: compile a config for a TPU slice or GPUs without them
    compare.py  attnscale-compare: runs side by side (their curves as a PNG, a table)

Flags are defined when `run()` is called, not at import, so the modules
import side by side (absl's flags are global).
"""
