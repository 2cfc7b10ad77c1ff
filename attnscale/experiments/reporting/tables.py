"""Tables: rows (a list of flat dicts) written as CSV and Markdown, side by side.

A row is a dict from column name to a plain value (str, int, float, None); the
columns are the first row's keys in order unless given. The same rows give:

  NAME.csv  for programs (csv.DictReader, pandas): a header line, then one line a
            row, "\\n" line ends. Floats to 6 significant digits by default, or
            exactly with `floats=str` (they read back equal); NaN as "nan",
            None as an empty cell.
  NAME.md   for people: a GitHub-flavoured Markdown table, numbers right-aligned.
            Floats by a format spec (".4g", ".4f") or a function (`power_of_two`),
            chosen per column; NaN as "nan" or a placeholder such as "-"; a "|"
            inside a cell escaped; chosen cells in bold. `write_tables` puts a
            title and notes above the table.

Figures of the same rows go next to them as NAME.png (`reporting.figures`).
Formatting is fixed, so a seeded study or a finished sweep writes byte-identical
tables on every run (the tests check it).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
# How a float becomes text: a format spec such as ".4f", or a function.
FloatFormat = str | Callable[[float], str]


def power_of_two(x: Any) -> str:
  """2**-9 as "2^-9" (learning rates are usually powers of two), else as str."""
  if isinstance(x, float) and x > 0:
    exponent = math.log2(x)
    if exponent == round(exponent):
      return f"2^{int(exponent)}"
  return str(x)


def format_value(x: Any, floats: FloatFormat = ".4g", nan: str = "nan") -> str:
  """A table cell: a float by `floats` (NaN as `nan`), None as empty, the rest by str."""
  if x is None:
    return ""
  if isinstance(x, float):
    if math.isnan(x):
      return nan
    return floats(x) if callable(floats) else format(x, floats)
  return str(x)


def _columns(rows: Sequence[Row], columns: Sequence[str] | None) -> list[str]:
  return list(columns if columns is not None else rows[0] if rows else ())


def to_csv(rows: Sequence[Row], columns: Sequence[str] | None = None, *,
           floats: FloatFormat = ".6g") -> str:
  """CSV text with a header row; keys of a row outside `columns` are left out."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  columns = _columns(rows, columns)
  writer.writerow(columns)
  for row in rows:
    writer.writerow([format_value(row.get(c), floats) for c in columns])
  return out.getvalue()


def to_markdown(rows: Sequence[Row], columns: Sequence[str] | None = None, *,
                floats: FloatFormat = ".4g", formats: Mapping[str, FloatFormat] | None = None,
                nan: str = "nan", numeric: Collection[str] | None = None,
                bold: Callable[[Row], Collection[str]] | None = None) -> str:
  """A GitHub-flavoured Markdown table ("" when there are no columns).

  Args:
    rows: the table's rows.
    columns: the columns in order (default: the first row's keys).
    floats: how floats are written, unless `formats` names the column.
    formats: per column, how its floats are written.
    nan: the text of a NaN cell.
    numeric: the right-aligned columns (default: those whose every value is a
      number or None). A known schema names them, so that a column of only NaN
      placeholders keeps its alignment.
    bold: per row, the columns whose cell is bold (a sweep's best point).
  """
  columns = _columns(rows, columns)
  if not columns:
    return ""
  formats = formats or {}
  if numeric is None:
    numeric = [c for c in columns
               if all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)]
  lines = ["| " + " | ".join(columns) + " |",
           "|" + "|".join("---:" if c in numeric else "---" for c in columns) + "|"]
  for row in rows:
    strong = bold(row) if bold else ()
    cells = []
    for c in columns:
      # A "|" inside a cell (as in "sum ||k||") would split it: escape it.
      cell = format_value(row.get(c), formats.get(c, floats), nan).replace("|", "\\|")
      cells.append(f"**{cell}**" if c in strong else cell)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def write_tables(rows: Sequence[Row], out_dir: str, name: str, *,
                 title: str = "", notes: Iterable[str] = (), **markdown) -> list[str]:
  """Writes OUT_DIR/NAME.csv and OUT_DIR/NAME.md (title, notes, table); returns the
  paths. `markdown`: `to_markdown`'s options (formats, floats) for the .md table."""
  os.makedirs(out_dir, exist_ok=True)
  csv_path = os.path.join(out_dir, f"{name}.csv")
  md_path = os.path.join(out_dir, f"{name}.md")
  with open(csv_path, "w") as f:
    f.write(to_csv(rows))
  header = [f"# {title}", ""] if title else []
  header += [f"{note}  " for note in notes]  # two spaces: a Markdown line break
  with open(md_path, "w") as f:
    f.write("\n".join(header) + ("\n\n" if header else "") + to_markdown(rows, **markdown))
  return [csv_path, md_path]
