"""Which code, software and machine a run came from: WORKDIR/provenance.json.

A result is only as good as knowing what produced it. The training loop calls
`write(workdir)` once per start, so a run that was resumed (perhaps after a
code change) keeps one record per segment:

    [{"commit": "8f57eff...", "dirty": false, "dirty_paths": [], "jax": "0.10.2", "jaxlib": "0.10.2",
      "python": "3.11.9", "device_kind": "cpu", "device_count": 1, "process_count": 1,
      "backend": "cpu", "platform": "Linux-6.8...-x86_64", "cpu": "AMD EPYC",
      "cpu_isa": "avx2", "argv": ["train.py", ...],
      "hostname": "...", "time_utc": "2026-11-25T10:00:00Z", "code": "/path/to/attnscale",
      "imports": {"my_scalings": "/home/me/work/my_scalings.py"},
      "pack_size": 1, "slot": 0, "attention_kernel": "native", "layernorm_kernel": "native"},
     ...]

The commit is that of the git checkout attnscale was imported from ("unknown"
when git is missing or the code is not in a checkout: an installed wheel);
"dirty" is whether `git status --porcelain` lists anything that could change what
runs: anything but run directories (runs/, where sweeps keep them), the docs
(docs/, where results are archived) and Markdown files, so uncommitted edits are on
record and a moved results folder or an edited page is not. "dirty_paths" names
them (the first MAX_PATHS), so that a reader can tell an edited module from a
stray file.
`read(run_dir)` returns the records, `commit_of(run_dir)` the one string a
results table keeps.

"cpu" and "cpu_isa" name the host processor (/proc/cpuinfo's model name) and
its widest vector extension (avx512f, avx2, avx, sse4_2, or the machine name
elsewhere). XLA:CPU compiles for the host's vector width, so the same commit,
config and seed can round differently on another kind of CPU (and then drift as
another seed would): a sweep whose points ran on two kinds of machine says so
here. On an accelerator the host CPU only
feeds it ("device_kind" names the chip).

"pack_size" is how many runs shared the compiled program (1: train.py's own,
unvmapped program; R: a pack of `sweep.py --pack=R`, its short last pack padded
to R), "slot" the run's place in it, and "pack" (packed runs) the directories of
the pack's runs: the same config and seed round differently at another pack size,
never with other pack-mates at the same one (docs/guides/sweeps.md, "Packing").
A record from before the fields has them written in afterwards from its command
line, with "recovered": ["pack_size", "slot"] (attnscale/experiments/provenance_backfill.py).

"attention_kernel" is the kernel the run's attention trained on
(`attnscale.models.base.attention_kernel`: "native", the C++ flash-attention
kernel a CPU run takes where it built; "xla", the XLA kernel, which every run
before it used; "splash", "cudnn" or "reference"): the kernels agree to rounding,
so a run on one does not repeat a run on another bit for bit. "layernorm_kernel"
likewise names its LayerNorms' (`attnscale.models.base.layernorm_kernel`:
"native", the C++ kernel a CPU run takes where it built; "xla", flax's
`nn.LayerNorm`, which every run before it used; "fused_xla").

"imports" (only in a run whose config has `imports`) maps each entry of
config.imports to the file it was imported from (`attnscale.config.imports.import_files`), so
that eval.py and the studies, run from another folder or with another sys.path,
import the same file (`import_files(run_dir)`; `eval_lib.load_config`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import subprocess
import sys

FILE = "provenance.json"
UNKNOWN = "unknown"
# The package's parent: a checkout's root when attnscale is not installed as a wheel.
CODE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Run directories, archived results and pages in the checkout are not code changes:
# a lent machine gets the tree with other studies' results moved aside, and a
# sweep's archive grows under docs/results while it runs.
IGNORED = ("runs/", "docs/")
IGNORED_SUFFIXES = (".md",)
MAX_PATHS = 20


def _git(*args: str, cwd: str = CODE) -> str | None:
  """git's stdout, or None when git is missing, fails, or hangs (5 s)."""
  try:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout if out.returncode == 0 else None


def git_state(cwd: str = CODE, tracked: str = os.path.abspath(__file__)
              ) -> tuple[str, bool | None]:
  """(commit, dirty) of the checkout at `cwd`: ("unknown", None) outside one, or
  in one that does not track the file `tracked` (this module: the code that runs).

  Dirty: `git status --porcelain` lists a tracked change or an untracked file
  outside IGNORED and not ending in IGNORED_SUFFIXES (`dirty_paths`).
  """
  commit, paths = dirty_paths(cwd, tracked)
  return commit, None if paths is None else bool(paths)


def dirty_paths(cwd: str = CODE, tracked: str = os.path.abspath(__file__)
                ) -> tuple[str, list[str] | None]:
  """(commit, the changed paths that count as code: `git_state`'s rule), paths
  relative to the checkout's root; None where git cannot say."""
  commit = _git("rev-parse", "HEAD", cwd=cwd)
  # The checkout must be this code's: a wheel installed in a venv inside some other
  # checkout would otherwise report that checkout's commit.
  if (commit is None or not commit.strip()
      or _git("ls-files", "--error-unmatch", tracked, cwd=cwd) is None):
    return UNKNOWN, None
  status = _git("status", "--porcelain", cwd=cwd)
  if status is None:
    return commit.strip(), None
  # A porcelain line is "XY path" (or "XY old -> new": both sides count); quoted
  # when unusual.
  paths = [p.strip('"') for line in status.splitlines() if line.strip()
           for p in line[3:].split(" -> ")]
  return commit.strip(), [p for p in dict.fromkeys(paths)
                          if not p.startswith(IGNORED) and not p.endswith(IGNORED_SUFFIXES)]


def host_cpu() -> tuple[str, str]:
  """(model name, widest vector extension) of this host's CPU, from /proc/cpuinfo
  (platform.processor() or the machine name, and "unknown", where it is absent)."""
  model, flags = None, set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
          model = value.strip()
        elif key in ("flags", "Features") and not flags:
          flags = set(value.split())
  except OSError:
    pass
  isa = next((x for x in ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd") if x in flags),
             UNKNOWN)
  return model or platform.processor() or platform.machine() or UNKNOWN, isa


def record() -> dict:
  """This process's provenance: code, versions, devices, command, host and time."""
  import jax  # here, not at import: reading provenance needs no JAX

  try:
    import jaxlib
    jaxlib_version = jaxlib.__version__
  except (ImportError, AttributeError):
    jaxlib_version = UNKNOWN
  commit, paths = dirty_paths()
  devices = jax.devices()
  cpu, cpu_isa = host_cpu()
  return {
      "commit": commit, "dirty": None if paths is None else bool(paths),
      "dirty_paths": None if paths is None else paths[:MAX_PATHS] + (
          [f"... and {len(paths) - MAX_PATHS} more"] if len(paths) > MAX_PATHS else []),
      "jax": jax.__version__, "jaxlib": jaxlib_version,
      "python": platform.python_version(),
      "device_kind": devices[0].device_kind if devices else UNKNOWN,
      "device_count": jax.device_count(), "process_count": jax.process_count(),
      "backend": jax.default_backend(), "platform": platform.platform(),
      "cpu": cpu, "cpu_isa": cpu_isa, "argv": list(sys.argv), "hostname": socket.gethostname(),
      "time_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "code": CODE,
  }


def read(run_dir: str) -> list[dict]:
  """The records of WORKDIR/provenance.json, oldest first ([] when there is none)."""
  path = os.path.join(run_dir, FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = json.load(f)
  return records if isinstance(records, list) else [records]


def write(workdir: str, **extra) -> dict | None:
  """Appends this start's `record()` (and `extra`, e.g. a packed run's pack) to
  WORKDIR/provenance.json (process 0 only; the others return None). Written whole
  to a temporary file, then renamed: a killed process leaves the old list, not
  half of a new one. Returns the record.
  """
  import jax

  if jax.process_index() != 0:
    return None
  entry = record() | extra
  path = os.path.join(workdir, FILE)
  try:
    records = read(workdir)
  except (OSError, ValueError):  # unreadable: kept beside, not lost, not fatal
    os.replace(path, path + ".unreadable")
    records = []
  with open(path + ".tmp", "w") as f:
    json.dump(records + [entry], f, indent=2)
  os.replace(path + ".tmp", path)
  return entry


def import_files(run_dir: str) -> dict[str, str]:
  """config.imports entry -> the file training imported it from, the newest
  segment's where several recorded one ({} without a record, or an unreadable one:
  the entries are then looked for by name alone)."""
  try:
    records = read(run_dir)
  except (OSError, ValueError):
    return {}
  files = {}
  for r in records:
    files.update(r.get("imports") or {})
  return files


def commit_of(run_dir: str) -> str:
  """The code a run came from as one string: its commit ("unknown" without a
  provenance.json), "+dirty" when any segment ran with uncommitted changes, and
  the commits joined by "+" in order when a resumed segment ran other code."""
  records = read(run_dir)
  commits = list(dict.fromkeys(r.get("commit", UNKNOWN) for r in records)) or [UNKNOWN]
  dirty = any(r.get("dirty") for r in records)
  return "+".join(commits) + ("+dirty" if dirty else "")


def host_of(run_dir: str) -> str:
  """The machine a run trained on as one string: "MODEL/ISA" of the host CPU for a
  CPU run (`host_cpu`), the device kind for an accelerator's, "+"-joined in order
  where resumed segments ran on different ones; "unrecorded" for a run whose
  records predate these fields (or have none)."""
  hosts = []
  for r in read(run_dir):
    if r.get("backend", "cpu") != "cpu":
      hosts.append(str(r.get("device_kind", UNKNOWN)))
    elif "cpu" in r:
      hosts.append(f"{r['cpu']}/{r.get('cpu_isa', UNKNOWN)}")
    else:
      hosts.append("unrecorded")
  return "+".join(dict.fromkeys(hosts)) or "unrecorded"
