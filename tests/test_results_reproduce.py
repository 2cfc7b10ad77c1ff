"""Every study page's committed tables come out again, byte for byte, from the
committed run records by the page's own command (issue #38: "every number on a
study page is recomputed from runs.csv by the page's study command").

Each case is the records-only command its page gives (docs/experiments/*.md), run
into a temporary folder; every .csv and .md it writes that is also committed in
docs/results/<study>/ must be identical. A table that no longer matches means a
page quotes numbers its records no longer give: a study's code changed, or a
table it reads (bert's char-LM ranking reads the practice sweep's) was rerun,
without the outputs being regenerated.

Not here: the transfer study, whose sweep is still running (its committed tables
are a snapshot the page dates; the archive grows past it), tables that need
weights (shared_kv's diagnostics, the trained-model studies, precision's
per-tensor figures), and figures (PNG bytes vary with matplotlib's version).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")
CONFIG = "configs/shakespeare_char.py"
STUDIES = "-m attnscale.studies"


# study folder -> the command (argv after python; OUT: the output folder; an argument
# ending in /*: its run directories, sorted, as the shell's * gives them).
CASES = {
    "graphcore_cpu": ["sweep.py", f"--config={CONFIG}", "--sweep=graphcore_cpu_protocol",
                      f"--workdir={RESULTS}/graphcore_cpu/raw", "--collect_only",
                      "--results_to=OUT"],
    "practice": ["sweep.py", f"--config={CONFIG}", "--sweep=practice",
                 f"--workdir={RESULTS}/practice/raw", "--collect_only", "--results_to=OUT"],
    "precision": [*STUDIES.split(), "precision", "--out", "OUT", "--workdirs",
                  f"{RESULTS}/precision/raw/*"],
    "sensitivity": [*STUDIES.split(), "sensitivity", "--out", "OUT", "--workdirs",
                    f"{RESULTS}/sensitivity/raw"],
    "bert": [*STUDIES.split(), "bert", "--no_eval", "--allow_mixed_code", "--out", "OUT",
             "--workdirs", f"{RESULTS}/bert/raw"],
    "length": [*STUDIES.split(), "length", "--out", "OUT", "--workdirs",
               f"{RESULTS}/length/raw/*"],
    "length_2025": [*STUDIES.split(), "length", "--out", "OUT", "--workdirs",
                    f"{RESULTS}/length_2025/raw/*"],
    "shared_kv": [*STUDIES.split(), "shared_kv", "--allow_mixed_code", "--no_diagnostics",
                  "--out", "OUT", "--workdirs", f"{RESULTS}/shared_kv/raw",
                  f"{RESULTS}/shared_kv/raw_cpu"],
    "depth": [*STUDIES.split(), "depth", "--out", "OUT", "--workdirs", f"{RESULTS}/depth/raw"],
    "critical_length": [*STUDIES.split(), "critical_length", "--out", "OUT", "--critical_raw",
                        f"{RESULTS}/critical_length/critical_length_raw.csv"],
}


def _argv(command, out):
  argv = []
  for arg in command:
    if arg.endswith("/*"):
      folder = arg.removesuffix("/*")
      argv += sorted(os.path.join(folder, d) for d in os.listdir(os.path.join(ROOT, folder)))
    else:
      argv.append(arg.replace("OUT", out))
  return argv


@pytest.mark.slow
@pytest.mark.parametrize("study", sorted(CASES))
def test_committed_tables_come_out_of_the_committed_records(study, tmp_path):
  if not os.path.isdir(os.path.join(ROOT, RESULTS, study)):
    pytest.skip(f"no {RESULTS}/{study} in this checkout")
  out = str(tmp_path / study)
  done = subprocess.run([sys.executable, *_argv(CASES[study], out)], cwd=ROOT,
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
