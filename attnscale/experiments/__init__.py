"""Experiments over many runs: sweeps and what is reported from them.

    sweeps.py         sweep points, running them (packed, --jobs), collecting rows
    run_records.py    one run directory: done or not, its row, archived records, eval
    lr_search.py      the staged learning-rate search (bracket the best rate, add seeds)
    stats.py          every comparison: t-intervals, paired or Welch verdicts, the
                      near-best band, the best rate's slope with a bootstrap interval
    sweep_results.py  best rate per scaling, noise verdicts, tables, runs.csv, figures
    reporting/        tables (CSV, Markdown) and figures, shared with the studies

May import every package below it (runtime, evaluation, ...).
"""
