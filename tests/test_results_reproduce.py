"""Every study page's committed tables come out again, byte for byte, from the
committed run records by the page's own command: every number on a study page is
recomputed from its records by the page's study command.

The records are each study's store, docs/results/<study>/runs.parquet
(attnscale/experiments/results_store.py: every archived run's files, one row a
run; STORE/FOLDER names one folder of a store of several). Each case is the
records-only command its page gives (docs/experiments/*.md), run into a temporary
folder; every .csv and .md it writes that is also committed in docs/results/<study>/
must be identical. A table that no longer matches means a page quotes numbers its
records no longer give: a study's code changed, or a table it reads (bert's
char-LM ranking reads the practice sweep's) was rerun, without the outputs being
regenerated.

Not here: tables that need weights (shared_kv's diagnostics, the trained-model
studies, precision's per-tensor figures), and figures (PNG bytes vary with
matplotlib's version and fonts; tests/test_results_store.py checks that one
figure saved twice gives the same bytes).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")
CONFIG = "configs/shakespeare_char.py"
STUDIES = "-m attnscale.studies"


STORE = "runs.parquet"


def _store(study: str, folder: str = "") -> str:
  return f"{RESULTS}/{study}/{STORE}" + (f"/{folder}" if folder else "")


# study folder -> the command (argv after python; OUT: the output folder).
CASES = {
    "graphcore_cpu": ["sweep.py", f"--config={CONFIG}", "--sweep=graphcore_cpu_protocol",
                      f"--workdir={_store('graphcore_cpu')}", "--collect_only",
                      "--results_to=OUT"],
    "practice": ["sweep.py", f"--config={CONFIG}", "--sweep=practice",
                 f"--workdir={_store('practice')}", "--collect_only", "--results_to=OUT"],
    "precision": [*STUDIES.split(), "precision", "--out", "OUT", "--workdirs",
                  _store("precision")],
    "sensitivity": [*STUDIES.split(), "sensitivity", "--out", "OUT", "--workdirs",
                    _store("sensitivity")],
    "bert": [*STUDIES.split(), "bert", "--no_eval", "--allow_mixed_code", "--out", "OUT",
             "--workdirs", _store("bert", "raw")],
    "length": [*STUDIES.split(), "length", "--out", "OUT", "--workdirs", _store("length")],
    "probes": [*STUDIES.split(), "probes", "--out", "OUT", "--workdirs", _store("probes")],
    "length_2025": [*STUDIES.split(), "length", "--out", "OUT", "--workdirs",
                    _store("length_2025")],
    "shared_kv": [*STUDIES.split(), "shared_kv", "--allow_mixed_code", "--no_diagnostics",
                  "--out", "OUT", "--workdirs", _store("shared_kv", "raw"),
                  _store("shared_kv", "raw_cpu")],
    "depth": [*STUDIES.split(), "depth", "--out", "OUT", "--workdirs", _store("depth")],
    "transfer": [*STUDIES.split(), "transfer", "--out", "OUT", "--allow_mixed_code",
                 "--workdirs", _store("transfer")],
    "mup_mults": [*STUDIES.split(), "transfer", "--out", "OUT", "--allow_mixed_code",
                  "--workdirs", _store("mup_mults"), _store("transfer"),
                  "--labels", "^mup_adam_standard", "--reference", "mup_adam_standard"],
    "critical_length": [*STUDIES.split(), "critical_length", "--out", "OUT", "--critical_raw",
                        f"{RESULTS}/critical_length/critical_length_raw.csv"],
    # A second study writing into the same folder: "folder#name".
    "critical_length#trained": [*STUDIES.split(), "critical_length_trained", "--out", "OUT",
                                "--workdirs", _store("critical_length")],
    "normalisers": [*STUDIES.split(), "normalisers", "--out", "OUT", "--workdirs",
                    _store("normalisers"), "--sink_runs",
                    f"{RESULTS}/normalisers/sink_hunt.parquet", "--bert_runs",
                    f"{RESULTS}/normalisers/bert_runs.parquet"],
}


@pytest.mark.slow
@pytest.mark.parametrize("study", sorted(CASES))
def test_committed_tables_come_out_of_the_committed_records(study, tmp_path):
  study = study.split("#")[0]  # the folder the command's tables are committed in
  folder = os.path.join(ROOT, RESULTS, study)
  if not os.path.isdir(folder):
    pytest.skip(f"no {RESULTS}/{study} in this checkout")
  # A study whose store is committed before its tables (its sweep still running):
  # nothing to compare yet.
  if not any(name.endswith((".csv", ".md")) for name in os.listdir(folder)):
    pytest.skip(f"{RESULTS}/{study} has no committed tables yet")
  out = str(tmp_path / study)
  done = subprocess.run([sys.executable, *(a.replace("OUT", out) for a in CASES[study])],
                        cwd=ROOT,
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-2000:]
  compared, differ = [], []
  for name in sorted(os.listdir(out)):
    committed = os.path.join(ROOT, RESULTS, study, name)
    if not name.endswith((".csv", ".md")) or not os.path.exists(committed):
      continue
    compared.append(name)
    with open(os.path.join(out, name), "rb") as a, open(committed, "rb") as b:
      if a.read() != b.read():
        differ.append(name)
  assert compared, f"{study}: the command wrote none of the committed tables"
  assert not differ, (f"{RESULTS}/{study}: {differ} differ from what the committed records "
                      "give; rerun the page's command and update the page")
