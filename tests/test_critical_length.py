"""The critical_length study: its roots are exact where they can be computed by
hand, its command runs on a tiny grid, and its tables come back from its raw records."""

import math
import os

import numpy as np
import pytest

from attnscale.studies import __main__ as studies_main
from attnscale.studies import critical_length as cl

TINY = ["--critical_dims", "8", "16", "--critical_max_n", "64", "--critical_seeds", "3"]
TABLES = ("critical_length.csv", "critical_length.md", "critical_length_beta.csv",
          "critical_length_beta.md")


def test_roots_match_the_closed_forms():
  # One key at 1, n - 1 at 0: top mass e^b / (e^b + n - 1) = 1/2 at b = log(n - 1).
  for n in (16, 1024):
    x = np.zeros(n)
    x[0] = 1.0
    assert cl.critical_beta(x, "top_half") == pytest.approx(math.log(n - 1), rel=1e-9)
  # Two keys apart by 1: H(b) = log 2 / 2 where p = sigmoid(b) solves h(p) = log(2) / 2.
  b = cl.critical_beta(np.array([1.0, 0.0]), "entropy_half")
  p = 1 / (1 + math.exp(-b))
  assert -(p * math.log(p) + (1 - p) * math.log(1 - p)) == pytest.approx(math.log(2) / 2)


def test_planted_keys_follow_the_log_law():
  # The query's own key among sphere keys: beta* ~ log n, far from n^(2/(d-1)) at d = 64.
  r = cl.critical_length((64,), dists=("planted",), max_n=4096, seeds=4)
  fit = next(f for f in r.fits() if f["criterion"] == cl.CRITERIA["top_half"])
  assert 0.8 < fit["p"] < 1.2 and fit["rms_log"] < fit["rms_power"]


def test_command_runs_and_its_tables_come_back_from_the_raw_records(tmp_path):
  out, again = str(tmp_path / "out"), str(tmp_path / "again")
  studies_main.main(["critical_length", "--out", out, *TINY])
  written = set(os.listdir(out))
  assert {"critical_length_raw.csv", "critical_length_curves.csv", "critical_length.png",
          "critical_length_curves.png", *TABLES} <= written
  studies_main.main(["critical_length", "--out", again, "--critical_raw",
                     os.path.join(out, "critical_length_raw.csv")])
  for name in TABLES:
    with open(os.path.join(out, name)) as a, open(os.path.join(again, name)) as b:
      assert a.read() == b.read(), name


def test_bad_flags_are_one_line_errors(capsys):
  with pytest.raises(SystemExit):
    studies_main.main(["critical_length", "--out", "x", "--critical_max_n", "100"])
  assert "--critical_max_n must be a power of 2 >= 16, got 100" in capsys.readouterr().err
