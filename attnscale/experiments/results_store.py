"""A study's archived run records in one file: docs/results/<study>/runs.parquet.

A sweep's `--archive_to` used to copy each finished run's records (config.json,
provenance.json, archived.json, metrics.jsonl.gz, eval.json, ...: `run_records.archive`)
into docs/results/<study>/raw/<run>/: 6,762 small files, 61.8 MB (50.7 MB of them
gzipped metrics; 94 MB on disk). A store holds the same records, one row a run (all
sixteen stores: 12.4 MB, metrics logs thinned as below):

  folder, run        the folder the run was archived in ("raw", "raw_cpu", ...) and
                     its directory name; rows sorted by both
  label ... host     convenience columns a researcher filters on, at packing time:
                     label (config.label, else `run_records.read_run`'s), variant,
                     learning_rate, seed, steps, status, final_train_loss, max_logit,
                     commit, host
  <file name>        one string column per record file, its text exactly (null: the
                     run has no such file); a gzipped file (metrics.jsonl.gz) is stored
                     decompressed under its name without ".gz"; a JSON-lines file
                     (metrics.jsonl) as three columns, its text with the floats taken
                     out and the floats themselves (`_encode`: FILE#template,
                     FILE#f32, FILE#f64)
  gzipped            the names of the run's files that were gzipped, so that `unpack`
                     gzips them again (byte for byte as `run_records.archive` did:
                     level 9, no timestamp)
  other_files        any file that is not UTF-8 text: [{name, data}] as bytes

so `unpack` gives back every run directory with the same files and contents (but
one rule: a metrics log keeps its per-head lists at the validation steps and on its
last line only, every scalar at every step: `thin_lists`, which decides most of a
store's size; docs/guides/sweeps.md), and
every reader (`python -m attnscale.studies ... --workdirs STORE`, `sweep.py
--collect_only --workdir=STORE`) reads a store where it read a folder: `workdir`
unpacks it once a process into a temporary folder.

Why parquet (zstd): pandas and pyarrow open it in one line (`pd.read_parquet(path,
columns=[...])` reads only the columns asked for, the convenience ones in
milliseconds); it is columnar, so each record kind is compressed with its kind (every
config.json beside the others, every metrics log's floats beside the others); with
the floats stored as floats (below) zstd makes the records a quarter of the size
of the files they replace; one file per study, so git and a copy to another machine handle one
blob instead of thousands.
JSON lines in a zip would keep the file layout but not open as a table; SQLite is
a table but neither columnar nor compressed.

A store is written whole: `add` (what `--archive_to=STORE` calls for each finished
run) reads it, replaces or adds the runs, writes a temporary file beside it and
renames it over the store (atomic on POSIX), holding a lock on the folder so that
two sweeps archiving into one store do not lose each other's runs. A crash leaves
the old store whole.

  python -m attnscale.experiments.results_store pack docs/results/transfer/runs.parquet runs/returned/raw
  python -m attnscale.experiments.results_store archive runs/sink_hunt docs/results/normalisers/sink_hunt.parquet
  python -m attnscale.experiments.results_store unpack docs/results/transfer/runs.parquet runs/transfer
  python -m attnscale.experiments.results_store ls docs/results/shared_kv/runs.parquet/raw_cpu
  python -m attnscale.experiments.results_store thin docs/results/transfer/runs.parquet
  python -m attnscale.experiments.results_store label docs/results/normalisers/runs.parquet \
      --config=configs/shakespeare_char.py --sweep=normalisers

STORE/FOLDER names the runs archived in one folder of a store (shared_kv's store
holds raw and raw_cpu); a store with one folder needs no FOLDER.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import gzip
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence

import numpy as np

SUFFIX = ".parquet"
# zstd at level 19 (22 or brotli 11 save another 1-2% at four times the time): writing
# the largest store (transfer, 736 runs, 6.8 MB) takes about 10 s of CPU, which
# `add` pays for each archived run.
COMPRESSION, LEVEL = "zstd", 19
# Bigger pages than parquet's 1 MB default: zstd then sees many runs' metrics at once.
PAGE_BYTES = 64 << 20
# From `run_records.read_run`: what a researcher filters runs on.
CONVENIENCE = ("label", "variant", "learning_rate", "seed", "steps", "status",
               "final_train_loss", "max_logit", "commit", "host")
_KEYS = ("folder", "run")


def is_store(path: str) -> bool:
  """Whether `path` names a store (FILE.parquet) or a folder in one (FILE.parquet/FOLDER)."""
  return split(path)[0] is not None


def split(path: str) -> tuple[str | None, str | None]:
  """(the store file, the folder named after it or None); (None, None) for a path
  that names no store."""
  parts = os.path.normpath(path).split(os.sep)
  for i, part in enumerate(parts):
    if part.endswith(SUFFIX):
      rest = parts[i + 1:]
      if len(rest) > 1:
        raise ValueError(f"{path}: name a store (X{SUFFIX}) or one folder in it "
                         f"(X{SUFFIX}/FOLDER), not {'/'.join(rest)}")
      return os.sep.join(parts[:i + 1]) or os.sep, rest[0] if rest else None
  return None, None


def archive(workdir: str, dest: str, names=None) -> list[str]:
  """`run_records.archive` into `dest`, a folder or a store (STORE[/FOLDER]): a
  store gets the same records added, replacing runs of the same names (`add`: the
  new store written beside the old and renamed over it, under a lock). Returns the
  runs archived."""
  from attnscale.experiments import run_records  # its JSON readers; no JAX
  if not is_store(dest):
    return run_records.archive(workdir, dest, names)
  store, folder = split(dest)
  with tempfile.TemporaryDirectory() as staged:
    copied = run_records.archive(workdir, staged, names)
    if copied:
      add(store, [os.path.join(staged, n) for n in copied], folder)
  return copied


# ---- packing ------------------------------------------------------------------


def _run_row(run_dir: str, folder: str) -> dict:
  """One row of a store: `run_dir`'s files, decompressed where gzipped, with its
  convenience columns."""
  from attnscale.experiments import run_records  # its JSON readers; no JAX
  row: dict = {"folder": folder, "run": os.path.basename(os.path.normpath(run_dir)),
               "gzipped": [], "other_files": []}
  for name in sorted(os.listdir(run_dir)):
    path = os.path.join(run_dir, name)
    if os.path.isdir(path):
      raise ValueError(f"{path}: a run's records are files; a folder (checkpoints?) "
                       "does not go into a store")
    with open(path, "rb") as f:
      data = f.read()
    column = name
    if name.endswith(".gz"):
      data, column = gzip.decompress(data), name.removesuffix(".gz")
      row["gzipped"].append(column)
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError:
      row["other_files"].append({"name": name, "data": data})
      continue
    if column in row or column in _KEYS + CONVENIENCE + ("gzipped", "other_files"):
      raise ValueError(f"{path}: the name {column!r} is already a column of the store")
    if column == METRICS:
      text = thin_lists(text)
    _put(row, column, text)
  read = run_records.read_run(run_dir)
  if read is not None:
    # The sweep's declared label where it has one, else the attention setup.
    declared = json.loads(row.get("config.json") or "{}").get("label")
    row.update({"label": declared or read["scaling"],
                **{k: read[k] for k in CONVENIENCE[1:]}})
  return row


def _put(row: dict, column: str, text: str) -> None:
  """`text` into `row` as the file `column`: a JSON-lines file as its three columns
  where `_encode` gives it back exactly, else (and any other file) as text."""
  numbers = _encode(text) if column.endswith(".jsonl") else None
  encoded = [column + suffix for suffix in (TEMPLATE, F32, F64)]
  if numbers is None:
    row[column] = text
  else:
    row.update(zip(encoded, numbers))
  for stale in encoded if numbers is None else [column]:
    if stale in row:  # a store's row read back: the other form's columns emptied
      row[stale] = None


METRICS = "metrics.jsonl"


def thin_lists(text: str) -> str:
  """A metrics log as a store keeps it: every scalar on every line, and the lists
  (the per-head metrics, one value a head) only on the lines of a validation step
  (a step with a `val/` metric) and on the last line that has any.

  The per-head lists are most of a log's floats (at 4 layers x 4 heads, two lists
  a layer, 32 floats a line against 16 scalars) and no study reads their history;
  the per-layer scalars beside them (max and mean over the heads) stay at every
  step. Lines that do not parse (a torn last line) are kept as they are;
  idempotent."""
  lines = text.split("\n")
  logged = []
  for line in lines:
    try:
      entry = json.loads(line)
    except json.JSONDecodeError:
      entry = None
    logged.append(entry if isinstance(entry, dict) else None)
  validated = {e.get("step") for e in logged if e and any(k.startswith("val/") for k in e)}
  with_lists = [i for i, e in enumerate(logged)
                if e and any(isinstance(v, list) for v in e.values())]
  keep = {i for i in with_lists if logged[i].get("step") in validated} | set(with_lists[-1:])
  for i in set(with_lists) - keep:
    lines[i] = json.dumps({k: v for k, v in logged[i].items() if not isinstance(v, list)})
  return "\n".join(lines)


def thin(store: str) -> int:
  """Rewrites the metrics logs of a store packed before `thin_lists` was its rule;
  returns the number of runs changed. Atomic, as `add`."""
  with _Locked(store):
    rows = _read_rows(store)
    changed = 0
    for r in rows:
      text = _files(r).get(METRICS)
      kept = None if text is None else thin_lists(text)
      if kept == text:
        continue
      _put(r, METRICS, kept)
      changed += 1
    if changed:
      _write(_table(rows), store)
  return changed


# A JSON-lines file (metrics.jsonl) is stored as three columns: its text with each
# float replaced by a mark (FILE#template: the keys, steps and layout, which compress
# to almost nothing), and its floats in order, those that are exactly float32 (what
# a run logs from float32 arrays) as float32, the rest as float64 (FILE#f32, FILE#f64,
# byte-stream-split: each byte of the floats compressed with its like). The digits of
# a float are noise to zstd; their bits compress a little. A float that a line
# already holds later is a mark too (_SAME and its distance: a layer's max_logit is
# the max of its per-head list that follows it), and so is one that is the float32
# mean of one of the next lists (_MEAN and which: a layer's entropy, the mean of its
# heads'), and so is one that is the float before it times a power of two (_TIMES
# and the exponent: tokens_per_s after steps_per_s). Each mark is checked when packing: the text must come back exactly, or
# the file is stored as text.
TEMPLATE, F32, F64 = "#template", "#f32", "#f64"
_MARK32, _MARK64, _SAME, _MEAN, _TIMES = "\x00", "\x01", "\x02", "\x03", "\x04"
# The character after _SAME is chr(_DISTANCE + k): the float k places on; after
# _MEAN, chr(_DISTANCE + g): the mean of the g-th list on (0: the next); after
# _TIMES, chr(_DISTANCE + _EXPONENT + j): the float before times 2^j.
_DISTANCE = 0xE000
_LISTS_ON = 4  # how many of the next lists a mean is looked for in
_EXPONENT = 64  # powers of two 2^-64 ... 2^64
_FLOAT = r"-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+)"
_ITEMS = re.compile(f"(\x00|\x01|\x02.|\x03.|\x04.|{_FLOAT})|(\\[)|(\\])", re.S)


def _items(line: str) -> tuple[list[re.Match], list[tuple[int, int]], list[int]]:
  """The floats (or marks) of a line; its lists ("[...]") as (index of the first
  float, index past the last), the empty ones left out; and for each float the
  index of the first list that opens after it."""
  floats, lists, opened_before, start = [], [], [], None
  for m in _ITEMS.finditer(line):
    if m.group(2):
      start = len(floats)
    elif m.group(3):
      if start is not None:
        lists.append((start, len(floats)))
      start = None
    else:
      opened_before.append(len(lists) + (start is not None))
      floats.append(m)
  return floats, lists, opened_before


def _means(lists: Sequence[Sequence[str]]) -> list[str]:
  """The float32 mean of each list of floats (written as text), as Python writes it;
  lists of one length at once (numpy's float32 mean of each row, as of a 1-D list)."""
  out = [""] * len(lists)
  by_length: dict[int, list[int]] = {}
  for i, texts in enumerate(lists):
    by_length.setdefault(len(texts), []).append(i)
  for rows in by_length.values():
    values = np.asarray([[float(t) for t in lists[i]] for i in rows], np.float32)
    for i, mean in zip(rows, values.mean(axis=1, dtype=np.float32).tolist()):
      out[i] = repr(mean)
  return out


_MARKS = re.compile(f"[{_MARK32}{_MARK64}{_SAME}{_MEAN}{_TIMES}{chr(_DISTANCE)}-\U0010ffff]")


def _times(before: str, written: str) -> str | None:
  """_TIMES and its exponent where `written` is the float `before` times a power of
  two (both as Python writes them; nonzero, finite), else None."""
  a, b = float(before), float(written)
  if (repr(a) != before or repr(b) != written or a == 0 or b == 0
      or not (math.isfinite(a) and math.isfinite(b))):
    return None
  fraction, exponent = math.frexp(b / a)
  j = exponent - 1
  if fraction != 0.5 or abs(j) > _EXPONENT or repr(math.ldexp(a, j)) != written:
    return None
  return _TIMES + chr(_DISTANCE + _EXPONENT + j)


def _encode(text: str) -> tuple[str, list[float], list[float]] | None:
  """(template, float32 values, float64 values) of `text`, or None where that would
  not give `text` back exactly (a mark already in it, ...): then the text is stored
  as it is. A float Python would write otherwise ("1.50") stays in the template."""
  if _MARKS.search(text):
    return None
  f32: list[float] = []
  f64: list[float] = []
  parsed = []
  for line in text.split("\n"):
    floats, lists, first = _items(line)
    texts = [m.group(0) for m in floats]
    parsed.append((line, floats, lists, first, texts))
  means = iter(_means([texts[slice(*a)] for _, _, lists, _, texts in parsed for a in lists]))
  lines = []
  for line, floats, lists, first, texts in parsed:
    mean_of = [next(means) for _ in lists]
    codes: list[str | None] = [None] * len(texts)
    for i in range(1, len(texts)):  # never a chain: the float before is known first
      if codes[i - 1] is None:
        codes[i] = _times(texts[i - 1], texts[i])
    later: dict[str, int] = {}
    for i in reversed(range(len(texts))):
      t = texts[i]
      if codes[i] is not None:  # _TIMES: no _SAME points at it, no _MEAN counts it
        continue
      on = [g for g in range(first[i], min(first[i] + _LISTS_ON, len(lists)))
            if mean_of[g] == t and all(c is None for c in codes[slice(*lists[g])])]
      if repr(float(t)) != t:
        codes[i] = t
      elif t in later and later[t] - i < 0x1000:
        codes[i] = _SAME + chr(_DISTANCE + later[t] - i)
      elif on:  # the mean of plain floats only: they are known before any mark
        codes[i] = _MEAN + chr(_DISTANCE + on[0] - first[i])
      later[t] = i
    out, at = [], 0
    for m, t, code in zip(floats, texts, codes):
      if code is None:
        value = float(t)
        if float(np.float32(value)) == value:
          f32.append(value)
          code = _MARK32
        else:
          f64.append(value)
          code = _MARK64
      out += [line[at:m.start()], code]
      at = m.end()
    lines.append("".join(out) + line[at:])
  encoded = ("\n".join(lines), f32, f64)
  return encoded if _decode(*encoded) == text else None


def _decode(template: str, f32: Sequence[float], f64: Sequence[float]) -> str:
  """The text `_encode` was given: marks replaced by the floats, in order."""
  next32 = iter(map(repr, np.asarray(f32, np.float32).astype(np.float64).tolist())).__next__
  next64 = iter(map(repr, np.asarray(f64, np.float64).tolist())).__next__
  parsed = []
  for line in template.split("\n"):
    floats, lists, first = _items(line)
    marks = [m.group(0) for m in floats]
    texts = [next32() if k == _MARK32 else next64() if k == _MARK64 else k for k in marks]
    averaged = sorted({first[i] + ord(k[1]) - _DISTANCE for i, k in enumerate(marks)
                       if k[0] == _MEAN})
    parsed.append((line, floats, lists, first, marks, texts, averaged))
  means = iter(_means([texts[slice(*lists[g])] for *_, lists, _, _, texts, averaged in parsed
                       for g in averaged]))
  lines = []
  for line, floats, _lists, first, marks, texts, averaged in parsed:
    mean_of = {g: next(means) for g in averaged}
    for i in reversed(range(len(texts))):
      if marks[i][0] == _MEAN:
        texts[i] = mean_of[first[i] + ord(marks[i][1]) - _DISTANCE]
      elif marks[i][0] == _SAME:
        texts[i] = texts[i + ord(marks[i][1]) - _DISTANCE]
    for i, k in enumerate(marks):
      if k[0] == _TIMES:
        texts[i] = repr(math.ldexp(float(texts[i - 1]), ord(k[1]) - _DISTANCE - _EXPONENT))
    out, at = [], 0
    for m, t in zip(floats, texts):
      out += [line[at:m.start()], t]
      at = m.end()
    lines.append("".join(out) + line[at:])
  return "\n".join(lines)


def _files(row: dict) -> dict[str, str]:
  """{file name as stored (no .gz): its text} of a store row."""
  files = {}
  for name, value in row.items():
    if name in _KEYS + CONVENIENCE + ("gzipped", "other_files") or value is None:
      continue
    if name.endswith(TEMPLATE):
      base = name.removesuffix(TEMPLATE)
      files[base] = _decode(value, row[base + F32], row[base + F64])
    elif not name.endswith((F32, F64)):
      files[name] = value
  return files


def _folder_rows(folder_dir: str, folder: str | None = None) -> list[dict]:
  """The rows of every run directory in `folder_dir` (named `folder`, by default
  its base name)."""
  folder = folder or os.path.basename(os.path.normpath(folder_dir))
  return [_run_row(os.path.join(folder_dir, name), folder)
          for name in sorted(os.listdir(folder_dir))
          if os.path.isdir(os.path.join(folder_dir, name))]


def _table(rows: Sequence[dict]):
  """The rows as a pyarrow table: keys, convenience columns, then the files."""
  import pyarrow as pa
  files = sorted({k for r in rows for k in r} - set(_KEYS + CONVENIENCE)
                 - {"gzipped", "other_files"})
  floats = ("learning_rate", "final_train_loss", "max_logit")
  ints = ("seed", "steps")
  schema = [(k, pa.string()) for k in _KEYS]
  schema += [(k, pa.float64() if k in floats else pa.int64() if k in ints else pa.string())
             for k in CONVENIENCE]
  schema += [(k, pa.list_(pa.float32()) if k.endswith(F32) else pa.list_(pa.float64())
             if k.endswith(F64) else pa.large_string()) for k in files]
  schema += [("gzipped", pa.list_(pa.string())),
             ("other_files", pa.list_(pa.struct([("name", pa.string()),
                                                 ("data", pa.large_binary())])))]
  rows = sorted(rows, key=lambda r: (r["folder"], r["run"]))
  return pa.table({k: pa.array([r.get(k) for r in rows], type=t) for k, t in schema})


def _write(table, store: str) -> None:
  """Writes `table` to `store` through a temporary file renamed over it."""
  import pyarrow.parquet as pq
  folder = os.path.dirname(os.path.abspath(store))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(store)}.", suffix=".tmp", dir=folder)
  os.close(fd)
  try:
    pq.write_table(table, tmp, compression=COMPRESSION, compression_level=LEVEL,
                   data_page_size=PAGE_BYTES, use_dictionary=list(_KEYS + CONVENIENCE),
                   column_encoding={f"{k}.list.element": "BYTE_STREAM_SPLIT"
                                    for k in table.column_names if k.endswith((F32, F64))})
    with open(tmp, "rb") as f:
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, store)
  except BaseException:
    os.remove(tmp)
    raise


class _Locked:
  """An exclusive lock on the store's folder (flock), held while it is rewritten."""

  def __init__(self, store: str):
    self.folder = os.path.dirname(os.path.abspath(store))

  def __enter__(self):
    os.makedirs(self.folder, exist_ok=True)
    self.fd = os.open(self.folder, os.O_RDONLY)
    fcntl.flock(self.fd, fcntl.LOCK_EX)

  def __exit__(self, *exc):
    fcntl.flock(self.fd, fcntl.LOCK_UN)
    os.close(self.fd)


def add(store: str, run_dirs: Sequence[str], folder: str | None = None) -> list[str]:
  """Adds each of `run_dirs` (its files: `run_records.archive`'s records) to `store`
  in `folder`, replacing a run of the same folder and name; returns their names.

  `folder` defaults to the store's one folder, "raw" for a new store. Atomic: the
  new store is written beside the old one and renamed over it, under a lock.
  """
  with _Locked(store):
    old = _read_rows(store) if os.path.exists(store) else []
    if folder is None:
      folders = sorted({r["folder"] for r in old})
      if len(folders) > 1:
        raise ValueError(f"{store} holds runs of {', '.join(folders)}: name one "
                         f"({store}/{folders[0]})")
      folder = folders[0] if folders else "raw"
    new = [_run_row(d, folder) for d in run_dirs]
    names = {(r["folder"], r["run"]) for r in new}
    _write(_table([r for r in old if (r["folder"], r["run"]) not in names] + new), store)
  return [r["run"] for r in new]


def pack(store: str, folders: Sequence[str]) -> int:
  """Adds every run directory of each folder in `folders` to `store` (the folder's
  base name its `folder`); returns the number of runs packed."""
  rows = [r for f in folders for r in _folder_rows(f)]
  keys = [(r["folder"], r["run"]) for r in rows]
  if len(set(keys)) != len(keys):
    raise ValueError("pack: two folders of the same name; pack them one at a time")
  with _Locked(store):
    old = _read_rows(store) if os.path.exists(store) else []
    _write(_table([r for r in old if (r["folder"], r["run"]) not in set(keys)] + rows), store)
  return len(rows)


def set_labels(path: str, labels: dict[str, str], note: str) -> int:
  """Declares the label of runs archived before sweeps stored one: writes
  `config.label` into the config.json of each run of `path` (a store, or STORE/FOLDER:
  that folder's runs only) named in `labels` (its directory name -> the label its
  sweep's point declares) that has none, and the `label` column; its archived.json
  lists the field under "backfilled" with `note` (how it was found). Returns the
  number of runs changed. Atomic, as `add`.
  """
  store, folder = split(path)
  with _Locked(store):
    rows = _read_rows(store)
    changed = 0
    for r in rows:
      config = json.loads(r["config.json"])
      if (folder is not None and r["folder"] != folder) or r["run"] not in labels or (
          config.get("label")):
        continue
      config["label"] = r["label"] = labels[r["run"]]
      r["config.json"] = json.dumps(config, indent=2, sort_keys=True)
      archived = json.loads(r.get("archived.json") or "{}")
      archived.setdefault("backfilled", {})["label"] = note
      r["archived.json"] = json.dumps(archived)
      changed += 1
    if changed:
      _write(_table(rows), store)
  return changed


# ---- reading ------------------------------------------------------------------


def _read_rows(store: str, folder: str | None = None, columns=None) -> list[dict]:
  """The store's rows as dicts (those of `folder` when given)."""
  import pyarrow.parquet as pq
  if not os.path.isfile(store):
    raise FileNotFoundError(f"{store}: no such store")
  filters = [("folder", "=", folder)] if folder is not None else None
  return pq.read_table(store, columns=columns, filters=filters).to_pylist()


def folders(store: str) -> list[str]:
  """The folders a store's runs were archived in, sorted."""
  return sorted({r["folder"] for r in _read_rows(store, columns=["folder"])})


def _selected(path: str) -> tuple[str, str]:
  """(store file, folder) that `path` names; one-line ValueError without a folder
  in a store of several, or with one it lacks."""
  store, folder = split(path)
  have = folders(store)
  if folder is None:
    if len(have) != 1:
      raise ValueError(f"{path} holds runs of {', '.join(have) or 'no folder'}: name one "
                       f"({store}/{have[0] if have else 'raw'})")
    return store, have[0]
  if folder not in have:
    raise ValueError(f"{path}: {store} has no folder {folder!r}; it has {', '.join(have)}")
  return store, folder


def unpack(path: str, dest: str, *, gzip_files: bool = True, only: str = "") -> list[str]:
  """Writes the runs of `path` (STORE or STORE/FOLDER) as DEST/<run>/ (for a store
  of several folders and no FOLDER: DEST/<folder>/<run>/); returns the run
  directories written. A file that was gzipped is gzipped again (level 9, no
  timestamp: the bytes `run_records.archive` wrote), or, with `gzip_files=False`,
  written plain under its name without ".gz" (what every reader reads as well).
  An existing file of the same name is overwritten; other files are left. `only`:
  the runs whose name matches this regular expression (re.search).
  """
  store, folder = split(path)
  several = folder is None and len(folders(store)) > 1
  written = []
  for row in _read_rows(store, folder):
    if only and not re.search(only, row["run"]):
      continue
    run_dir = os.path.join(dest, row["folder"], row["run"]) if several else os.path.join(
        dest, row["run"])
    os.makedirs(run_dir, exist_ok=True)
    for name, text in _files(row).items():
      data = text.encode("utf-8")
      if name in row["gzipped"]:
        if gzip_files:
          data, name = gzip.compress(data, mtime=0), name + ".gz"
        elif os.path.exists(os.path.join(run_dir, name + ".gz")):
          os.remove(os.path.join(run_dir, name + ".gz"))  # no stale twin beside it
      with open(os.path.join(run_dir, name), "wb") as f:
        f.write(data)
    for other in row["other_files"]:
      with open(os.path.join(run_dir, other["name"]), "wb") as f:
        f.write(other["data"])
    written.append(run_dir)
  return written


# Stores unpacked by this process for reading: {unpacked folder: the path given}.
_OPENED: dict[str, str] = {}
_CACHE: dict[tuple[str, str, float, int], str] = {}


def workdir(path: str) -> str:
  """A folder of run directories to read for `path`: `path` itself unless it names
  a store (STORE or STORE/FOLDER), else its runs unpacked (metrics plain, to skip
  the gzip) into a temporary folder removed when the process exits; once a process
  for the same store file as it is on disk.

  Raises:
    ValueError: (one line) a store of several folders without FOLDER, or an
      unknown FOLDER.
  """
  if not is_store(path):
    return path
  store, folder = _selected(path)
  stat = os.stat(store)
  key = (os.path.realpath(store), folder, stat.st_mtime, stat.st_size)
  if key not in _CACHE:
    root = tempfile.mkdtemp(prefix="attnscale-store-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    unpack(f"{store}/{folder}", os.path.join(root, folder), gzip_files=False)
    os.makedirs(os.path.join(root, folder), exist_ok=True)  # an empty folder reads empty
    _CACHE[key] = os.path.join(root, folder)
  _OPENED[_CACHE[key]] = path
  return _CACHE[key]


def workdirs(paths: Sequence[str]) -> list[str]:
  """`workdir` of each path."""
  return [workdir(p) for p in paths]


def run_dirs(paths: Sequence[str]) -> list[str]:
  """Run directories: a store (a folder `workdir` unpacked) gives each of its runs,
  in name order; any other path is kept (a run directory, as the shell gave it)."""
  out = []
  for p in paths:
    if p in _OPENED:
      out += [os.path.join(p, name) for name in sorted(os.listdir(p))]
    elif is_store(p):
      out += run_dirs([workdir(p)])
    else:
      out.append(p)
  return out


def shown(path: str) -> str:
  """The path as the user gave it: a store's path for the folder `workdir` unpacked
  it into (what notes under a table print), else `path`."""
  return _OPENED.get(path, path)


def runs_frame(path: str):
  """The store's runs (STORE or STORE/FOLDER) as a pandas DataFrame of its keys and
  convenience columns, without the files' contents."""
  import pandas as pd
  store, folder = split(path)
  filters = [("folder", "=", folder)] if folder is not None else None
  return pd.read_parquet(store, columns=list(_KEYS + CONVENIENCE), filters=filters)


def metrics_frame(path: str, metrics: Sequence[str] | None = None,
                  runs: Sequence[str] | None = None):
  """The metric histories of a store's runs (STORE or STORE/FOLDER) as a long pandas
  DataFrame: one row per (folder, run, step, metric) with its `value`: a float, or
  a list for per-head metrics (train/attn/max_logit_heads/layer_0: one value a
  head, kept as a list).

  Args:
    path: STORE or STORE/FOLDER.
    metrics: only these metric names (all the store's otherwise: tens of millions
      of rows for the largest study).
    runs: only these run names.
  """
  import pandas as pd
  store, folder = split(path)
  wanted = set(metrics) if metrics is not None else None
  records = []
  for row in _read_rows(store, folder):
    text = _files(row).get("metrics.jsonl")
    if runs is not None and row["run"] not in runs or not text:
      continue
    for line in text.splitlines():
      try:
        logged = json.loads(line)
      except json.JSONDecodeError:  # a torn last line, as metrics_writer skips it
        continue
      step = logged.pop("step", None)
      for name, value in logged.items():
        if wanted is None or name in wanted:
          records.append((row["folder"], row["run"], step, name, value))
  return pd.DataFrame.from_records(records, columns=["folder", "run", "step", "metric",
                                                     "value"])


# ---- command line -------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m attnscale.experiments.results_store pack|archive|unpack|ls ...`."""
  p = argparse.ArgumentParser(prog="python -m attnscale.experiments.results_store",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="command", required=True)
  a = sub.add_parser("pack", help="add (or replace) the runs of run folders in a store")
  a.add_argument("store", help=f"the store file (X{SUFFIX})")
  a.add_argument("folders", nargs="+", help="folders of run directories (each run: "
                 "run_records.archive's files); the folder's name is the runs' folder")
  r = sub.add_parser("archive", help="add the finished runs of a workdir (their "
                     "records, no checkpoints: what a sweep's --archive_to adds)")
  r.add_argument("workdir", help="a folder of run directories (train.py's --workdir's "
                 "parent; each finished run's records go in)")
  r.add_argument("store", help=f"X{SUFFIX} or X{SUFFIX}/FOLDER")
  u = sub.add_parser("unpack", help="write a store's runs as run directories")
  u.add_argument("store", help=f"X{SUFFIX} or X{SUFFIX}/FOLDER")
  u.add_argument("dest", help="the folder to write DEST/<run>/ into (e.g. a sweep's "
                 "--workdir, to resume it: its finished runs count as done)")
  u.add_argument("--only", default="", help="only the runs whose name matches this "
                 "regular expression (re.search)")
  lab = sub.add_parser("label", help="write each run's label into its config.json "
                       "(config.label), from the point of the sweep that made it, for "
                       "runs archived before sweeps stored it")
  lab.add_argument("store", help=f"X{SUFFIX} (or X{SUFFIX}/FOLDER: that folder's runs)")
  lab.add_argument("--config", required=True, help="the sweep's config file "
                   "(configs/shakespeare_char.py)")
  lab.add_argument("--sweep", required=True, help="the sweep that made the runs (several, "
                   "comma-separated: a run's label from whichever has its point)")
  th = sub.add_parser("thin", help="keep the per-head lists of each run's metrics log "
                      "at its validation steps and last line only (`thin_lists`: what "
                      "a store packed today keeps), for a store packed before")
  th.add_argument("store", help=f"X{SUFFIX}")
  ls = sub.add_parser("ls", help="list a store's runs")
  ls.add_argument("store", help=f"X{SUFFIX} or X{SUFFIX}/FOLDER")
  args = p.parse_args(argv)
  try:
    if args.command == "pack":
      for folder in args.folders:
        if not os.path.isdir(folder):
          p.error(f"pack: {folder} is not a folder")
      if not args.store.endswith(SUFFIX):
        p.error(f"pack: the store must end in {SUFFIX}, got {args.store}")
      n = pack(args.store, args.folders)
      print(f"packed {n} runs into {args.store} ({os.path.getsize(args.store)} bytes)")
    elif args.command == "archive":
      if not os.path.isdir(args.workdir):
        p.error(f"archive: {args.workdir} is not a folder")
      if not is_store(args.store):
        p.error(f"archive: the store must end in {SUFFIX} (or {SUFFIX}/FOLDER), "
                f"got {args.store}")
      runs = archive(args.workdir, args.store)
      print(f"archived {len(runs)} finished runs into {args.store}")
    elif args.command == "unpack":
      if split(args.store)[1] is not None:
        _selected(args.store)
      n = len(unpack(args.store, args.dest, only=args.only))
      print(f"unpacked {n} runs into {args.dest}")
    elif args.command == "label":
      from attnscale.experiments import sweeps
      if split(args.store)[1] is not None:
        _selected(args.store)
      labels: dict[str, str] = {}
      for name in args.sweep.split(","):
        for point in sweeps.load_sweep(args.config, name, workdir=workdir(args.store)):
          if point.label and labels.setdefault(point.name, point.label) != point.label:
            p.error(f"label: run {point.name} is {labels[point.name]!r} in one sweep and "
                    f"{point.label!r} in {name}")
      n = set_labels(args.store, labels, f"the label of its point in {args.sweep} "
                     f"({os.path.basename(args.config)}), by its directory name")
      print(f"labelled {n} runs of {args.store}")
    elif args.command == "thin":
      before = os.path.getsize(args.store)
      n = thin(args.store)
      print(f"thinned the metrics logs of {n} runs of {args.store} ({before} -> "
            f"{os.path.getsize(args.store)} bytes)")
    else:
      frame = runs_frame(args.store)
      with __import__("pandas").option_context("display.max_rows", None,
                                                "display.width", 200):
        print(frame[["folder", "run", "label", "learning_rate", "seed", "status",
                     "final_train_loss"]].to_string(index=False))
      print(f"{len(frame)} runs")
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  main()
