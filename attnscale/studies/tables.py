"""Writing a study's rows (a list of flat dicts) as CSV and Markdown.

Floats are formatted with a fixed number of significant digits, so a seeded
study writes byte-identical tables on every run (the tests check it).
"""

from __future__ import annotations

import csv
import io
import math
import os
from typing import Any, Iterable, Sequence

Row = dict[str, Any]


def format_value(x: Any, digits: int) -> str:
  """A table cell: floats to `digits` significant digits, None as empty."""
  if x is None:
    return ""
  if isinstance(x, float):
    return "nan" if math.isnan(x) else f"{x:.{digits}g}"
  return str(x)


def to_csv(rows: Sequence[Row], digits: int = 6) -> str:
  """CSV text with a header row; columns in the first row's key order."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  columns = list(rows[0]) if rows else []
  writer.writerow(columns)
  for row in rows:
    writer.writerow([format_value(row.get(c), digits) for c in columns])
  return out.getvalue()


def to_markdown(rows: Sequence[Row], digits: int = 4) -> str:
  """A GitHub-flavoured Markdown table (numbers right-aligned)."""
  if not rows:
    return ""
  columns = list(rows[0])
  numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
             for c in columns]
  lines = ["| " + " | ".join(columns) + " |",
           "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
  for row in rows:
    # A "|" inside a cell (as in "sum ||k||") would split it: escape it.
    cells = (format_value(row.get(c), digits).replace("|", "\\|") for c in columns)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def write_tables(rows: Sequence[Row], out_dir: str, name: str, *,
                 title: str = "", notes: Iterable[str] = ()) -> list[str]:
  """Writes OUT_DIR/NAME.csv and OUT_DIR/NAME.md (title, notes, table); returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  csv_path = os.path.join(out_dir, f"{name}.csv")
  md_path = os.path.join(out_dir, f"{name}.md")
  with open(csv_path, "w") as f:
    f.write(to_csv(rows))
  header = [f"# {title}", ""] if title else []
  header += [f"{note}  " for note in notes]
  with open(md_path, "w") as f:
    f.write("\n".join(header) + ("\n\n" if header else "") + to_markdown(rows))
  return [csv_path, md_path]
