"""Scale studies: the published simulations and figures, computed with attnscale.

Each study is a pure compute function returning a plain result (with `.rows()`
for tables), a plot function returning a matplotlib Figure, and one CLI name in
`python -m attnscale.studies NAME --out DIR`:

  output_scale  std of the attention output against n, every scaling, bidirectional
                and causal (Graphcore 2023): `output_scale`, `plot_output_scale`.
  temperature   the same against the softmax temperature t: `temperature_sweep`,
                `plot_temperature`.
  key_norms     Bernhard 2023's simulations: the distribution of the first key's
                attention weight per scaling: `key_norms`, `plot_key_norms`.
  trained       per-layer attention diagnostics of trained runs:
                `trained_diagnostics`, `plot_trained`.
  coord_check   muP's coordinate check: every layer's output scale against width
                after a few training steps, sp against mup
                (attnscale/studies/coord_check.py: `coord_check`, `plot_coord_check`).

`write_tables` and `save_figure` write a study's CSV/Markdown and PNG; they (and
`to_csv`, `to_markdown`) are `attnscale.experiments.reporting`'s, re-exported here for
notebooks, and shared with the sweeps.

The modules: the simulations (output_std.py, key_norm_kde.py, critical_length.py,
coord_check.py), the studies of trained runs, each reading its sweep's store
(trained.py, length.py, precision.py, sensitivity.py, shared_kv.py, bert.py,
width.py, critical_trained.py, transfer.py with transfer_runs.py,
transfer_sensitivity.py and transfer_summary.py, normalisers.py with
normalisers_runs.py and normalisers_figures.py, probes.py), registry.py (the names
`python -m attnscale.studies` takes, one line each) and __main__.py (that command).

May import every lower layer: checks, fields, core, numerics, models, data, tasks,
config, runtime, evaluation and experiments.
"""

from attnscale.experiments.reporting import save_figure, to_csv, to_markdown, write_tables
from attnscale.studies.key_norm_kde import (
                                          DEFAULT_METHODS,
                                          DISTRIBUTIONS,
                                          KeyNormResult,
                                          Method,
                                          gaussian_kde,
                                          key_norms,
                                          plot_key_norms,
                                          sample_qk,
                                          silverman_bandwidth,
                                          summary,
)
from attnscale.studies.output_std import (
                                          OutputScaleResult,
                                          TemperatureResult,
                                          default_scalings,
                                          graphcore_theory,
                                          output_scale,
                                          plot_output_scale,
                                          plot_temperature,
                                          temperature_sweep,
                                          with_temperature,
)
from attnscale.studies.trained import (
                                          RunDiagnostics,
                                          TrainedResult,
                                          plot_trained,
                                          run_diagnostics,
                                          trained_diagnostics,
)

__all__ = [
    "DEFAULT_METHODS", "DISTRIBUTIONS", "KeyNormResult", "Method", "OutputScaleResult",
    "RunDiagnostics",
    "TemperatureResult", "TrainedResult", "default_scalings", "gaussian_kde",
    "graphcore_theory", "key_norms", "output_scale", "plot_key_norms", "plot_output_scale",
    "plot_temperature", "plot_trained", "run_diagnostics", "sample_qk", "save_figure",
    "silverman_bandwidth", "summary", "temperature_sweep", "to_csv", "to_markdown",
    "trained_diagnostics", "with_temperature", "write_tables",
]
