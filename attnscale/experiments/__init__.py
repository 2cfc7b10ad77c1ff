"""Experiments over many runs: sweeps and what is reported from them.

    sweeps.py         sweep points, skip/resume, reading runs into rows
    lr_search.py      the staged learning-rate search (bracket the best rate, add seeds)
    sweep_results.py  best rate per scaling, noise verdicts, tables and figures
    reporting/        tables (CSV, Markdown) and figures, shared with the studies

May import every package below it (runtime, evaluation, ...).
"""
