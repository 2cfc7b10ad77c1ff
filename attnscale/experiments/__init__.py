"""Experiments over many runs: sweeps and what is reported from them.

    sweeps.py         sweep points, running them (packed, --jobs), collecting rows
    sweep_builders.py the shapes a config's sweeps take (grid, staged, axis_search, ...)
    run_records.py    one run directory: done or not, its row, archived records, eval
    results_store.py  a study's archived runs in one parquet store (docs/results/<study>)
    lr_search.py      the staged learning-rate search (bracket the best rate, add seeds)
    stats.py          every comparison: t-intervals, paired or Welch verdicts, the
                      near-best band, tie sets, Holm's correction, bootstrap slopes
    student_t.py      Student's t tail and quantile, without scipy
    verdicts.py       the tie-robust and family-wise verdicts as table columns
    sweep_results.py  best rate per scaling, noise verdicts, tables, runs.csv, figures
    page_check.py     every estimate on a study page tied to its table cell
    provenance_table.py  each study page's provenance section, from its store
    provenance_backfill.py  pack_size and slot recovered into older stores' records
    reporting/        tables (CSV, Markdown) and figures, shared with the studies

May import every lower layer: checks, fields, core, numerics, models, data, tasks,
config, runtime and evaluation.
"""
