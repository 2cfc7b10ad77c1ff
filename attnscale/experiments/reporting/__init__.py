"""Reporting: the tables and figures of sweeps and studies, written one way.

A result is written as files side by side in one directory, from the same rows
(a list of flat dicts):

  NAME.csv  every column, for programs; floats to 6 significant digits or exact.
  NAME.md   a Markdown table for people (a title and notes above it), numbers
            right-aligned and formatted per column.
  NAME.png  the figure, a pyplot-free matplotlib Figure saved without version
            metadata, so a seeded run writes the same bytes.

`tables` holds the CSV and Markdown writers, `figures` the figure helpers.
Sweeps (`attnscale.experiments.sweeps`) and studies (`attnscale.studies`) both write
through this package and neither imports the other.
"""

from attnscale.experiments.reporting.figures import (
                                         DPI,
                                         PNG_METADATA,
                                         label_axes,
                                         new_figure,
                                         save_figure,
                                         style,
)
from attnscale.experiments.reporting.tables import (
                                         FloatFormat,
                                         Row,
                                         format_value,
                                         power_of_two,
                                         to_csv,
                                         to_markdown,
                                         write_tables,
)

__all__ = [
    "DPI", "FloatFormat", "PNG_METADATA", "Row", "format_value", "label_axes", "new_figure",
    "power_of_two", "save_figure", "style", "to_csv", "to_markdown", "write_tables",
]


def write_study(fig, rows, out_dir: str, name: str, title: str, notes: list[str]):
  """A study's PNG, CSV and Markdown in `out_dir`: (their paths, `notes`), what a
  study's runner returns (`attnscale.studies.registry.Study.run`)."""
  paths = [save_figure(fig, out_dir, name)]
  return paths + write_tables(rows, out_dir, name, title=title, notes=notes), notes
