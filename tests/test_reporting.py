"""The shared table and figure writers: Markdown formatting, CSV round trip, PNGs."""

import csv
import io
import math

from attnscale.experiments import reporting

ROWS = [{"scaling": "standard", "lr": 2.0**-9, "loss": 2.123456, "steps": 40},
        {"scaling": "cosine", "lr": 0.003, "loss": math.nan, "steps": None}]


def test_markdown_default_formats_and_alignment():
  lines = reporting.to_markdown(ROWS).splitlines()
  assert lines[0] == "| scaling | lr | loss | steps |"
  assert lines[1] == "|---|---:|---:|---:|"  # all-number (or None) columns right-aligned
  assert lines[2] == "| standard | 0.001953 | 2.123 | 40 |"  # 4 significant digits
  assert lines[3] == "| cosine | 0.003 | nan |  |"  # NaN as nan, None empty
  assert reporting.to_markdown([]) == ""


def test_markdown_column_formats_nan_placeholder_and_bold():
  table = reporting.to_markdown(
      ROWS, ("scaling", "lr", "loss"), floats=".4f", nan="-",
      formats={"lr": reporting.power_of_two}, numeric=("lr", "loss"),
      bold=lambda row: ("loss",) if row["scaling"] == "standard" else ())
  assert table.splitlines()[2:] == ["| standard | 2^-9 | **2.1235** |",
                                    "| cosine | 0.003 | - |"]
  # Columns given: the header even without rows, with the stated alignment.
  assert reporting.to_markdown([], ("a", "b"), numeric=("b",)) == "| a | b |\n|---|---:|\n"
  # A "|" in a cell is escaped, so it does not split the cell.
  assert reporting.to_markdown([{"m": "q.k / ||k||"}]).splitlines()[2] == r"| q.k / \|\|k\|\| |"


def test_power_of_two():
  assert reporting.power_of_two(2.0**-9) == "2^-9"
  assert reporting.power_of_two(1.0) == "2^0"
  assert reporting.power_of_two(0.003) == "0.003"
  assert reporting.power_of_two(3) == "3"


def test_csv_round_trip():
  text = reporting.to_csv(ROWS, floats=str)
  assert text.splitlines()[0] == "scaling,lr,loss,steps"
  back = list(csv.DictReader(io.StringIO(text)))
  assert [r["scaling"] for r in back] == ["standard", "cosine"]
  assert float(back[0]["lr"]) == 2.0**-9 and float(back[0]["loss"]) == 2.123456
  assert math.isnan(float(back[1]["loss"])) and back[1]["steps"] == ""
  # By default 6 significant digits; columns given leave the others out.
  assert reporting.to_csv(ROWS[:1], ("loss",)) == "loss\n2.12346\n"


def _figure():
  fig = reporting.new_figure(3, 2)
  ax = fig.subplots()
  ax.plot([1, 2], [3, 4], label="standard", **reporting.style(0))
  reporting.label_axes(ax, xlabel="x", ylabel="y", title="t")
  return fig


def test_write_tables_and_figure_side_by_side(tmp_path):
  paths = reporting.write_tables(ROWS, str(tmp_path), "result", title="T", notes=["a note"])
  assert paths == [str(tmp_path / "result.csv"), str(tmp_path / "result.md")]
  assert (tmp_path / "result.md").read_text().startswith("# T\n\na note  \n\n| scaling |")
  path = reporting.save_figure(_figure(), str(tmp_path), "result")
  assert path == str(tmp_path / "result.png")
  png = (tmp_path / "result.png").read_bytes()
  assert png.startswith(b"\x89PNG") and b"matplotlib" not in png  # no version metadata
  # The same figure, built again, gives the same bytes.
  reporting.save_figure(_figure(), str(tmp_path / "again"), "result")
  assert (tmp_path / "again" / "result.png").read_bytes() == png
