"""Local copies of raw data files, for machines without network access.

`$ATTNSCALE_DATA` may point at a folder laid out like

    tinyshakespeare/input.txt
    wikitext-2/{train,valid,test}.txt
    wikitext-103/{train,valid,test}.txt   (optional; no known sha256: read unchecked)

When it is set, the dataset builders read their source files from there and
never touch the network; when it is unset they download (with a checksum check).
Every local copy is checked against the same sha256 as a download would be, so a
run never silently trains on a different file.

The value must be an absolute path. A relative one would mean a different folder
in every process that starts elsewhere (a notebook's kernel in notebooks/, a
sweep's children, a project folder of one's own), so it is refused in one line
that says how to make it absolute (`export ATTNSCALE_DATA=$PWD/...`).

Both ways fail in one line that names `$ATTNSCALE_DATA` and the file it needs:
unset on a machine that cannot reach the download (`check_reachable`, seconds,
where TFDS's own retries would take minutes and end in a traceback), or set to
a folder that does not exist, even when the dataset was prepared before and
its files would not be read again (`check_sources`; set to a folder without
them, a prepared dataset is read with a warning that names it).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import threading
import urllib.parse

ENV_VAR = "ATTNSCALE_DATA"
GUIDE = "docs/guides/training.md#offline-data"


def data_root() -> pathlib.Path | None:
  """The folder named by `$ATTNSCALE_DATA`, or None when it is unset or empty.

  Raises:
    FileNotFoundError: the value is a relative path (one line: its meaning would
      depend on the folder each process happens to start in).
  """
  root = os.environ.get(ENV_VAR, "")
  if not root:
    return None
  path = pathlib.Path(root).expanduser()
  if not path.is_absolute():
    raise FileNotFoundError(
        f"{ENV_VAR}={root} is a relative path, which names another folder in every process "
        f"that starts elsewhere (a notebook, a sweep's runs, your own folder): set it absolute, "
        f"e.g. export {ENV_VAR}=$PWD/{root} from the folder it was meant from")
  return path


def sha256_of(path: pathlib.Path) -> str:
  """Hex sha256 of a file, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def local_file(relpath: str, url: str, sha256: str | None) -> pathlib.Path | None:
  """The verified local copy of `url` under `$ATTNSCALE_DATA`.

  Args:
    relpath: where the file lives under the data root, e.g.
      "tinyshakespeare/input.txt" or "wikitext-2/train.txt".
    url: where the file comes from; only used in error messages.
    sha256: expected hex digest of the file, or None to skip the check.

  Returns:
    The path of the local copy, or None when `$ATTNSCALE_DATA` is unset (the
    caller then downloads `url` itself).

  Raises:
    FileNotFoundError: `$ATTNSCALE_DATA` is set but the file is not there. The
      message gives the full path to put it at and the URL to fetch it from.
    ValueError: the local copy's sha256 differs from `sha256`.
  """
  root = data_root()
  if root is None:
    return None
  path = (root / relpath).absolute()
  if not path.is_file():
    raise FileNotFoundError(
        f"{ENV_VAR}={root} but {path} does not exist: download {url} and save "
        f"it as {path} (or unset {ENV_VAR} to download automatically).")
  if sha256 is not None:
    actual = sha256_of(path)
    if actual != sha256.lower():
      raise ValueError(
          f"sha256 mismatch for {path}: expected {sha256}, got {actual}. "
          f"Replace it with a fresh copy of {url}.")
  return path


def check_reachable(url: str, relpath: str, timeout_s: float = 10.0) -> None:
  """Fails at once, naming `$ATTNSCALE_DATA` and `relpath`, if `url` cannot be reached.

  Called before a download. TFDS's downloader retries a connection that fails
  ten times with exponential backoff (about 200 s, silently) and then ends in a
  long traceback that never says the data could be given locally. One request
  (a HEAD, through the same `requests` and proxy settings as TFDS's download,
  no retries) tells in seconds. Only a failure to connect counts: an HTTP error
  status is left to the download, whose own error names it.

  Raises:
    FileNotFoundError: the host cannot be reached (one line).
  """
  import requests  # TFDS's own HTTP client

  outcome: list = []

  def probe():
    try:
      requests.head(url, timeout=timeout_s, allow_redirects=True).close()
      outcome.append(None)
    except (requests.ConnectionError, requests.Timeout) as e:
      outcome.append(e)
    except Exception:  # noqa: BLE001 - anything else is the download's to report
      outcome.append(None)

  # In a thread: a name lookup that hangs is not bounded by requests' timeout.
  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(timeout_s + 5)
  error = outcome[0] if outcome else TimeoutError(f"no answer in {timeout_s + 5:.0f} s")
  if error is None:
    return
  host = urllib.parse.urlsplit(url).hostname
  raise FileNotFoundError(
      f"cannot reach {host} to download {url} ({type(error).__name__}): offline, set "
      f"{ENV_VAR} to a folder holding {relpath} ({GUIDE})")


def check_sources(builder) -> None:
  """With `$ATTNSCALE_DATA` set, checks it whether or not `builder` is prepared.

  A prepared dataset never reads its source files again, so a wrong
  `$ATTNSCALE_DATA` would otherwise go unnoticed. Before preparing, a missing
  file of this dataset (`builder.local_sources()`: {path under the root: where
  it comes from}) is the error `local_file` raises, naming where to put it.
  With a prepared copy, a root that is not a folder is an error, and a folder
  without the file a warning naming it (the prepared copy is read).
  """
  root = data_root()
  if root is None:
    return
  sources = builder.local_sources() if hasattr(builder, "local_sources") else {}
  missing = [relpath for relpath in sources if not (root / relpath).is_file()]
  if missing and not builder.is_prepared():
    local_file(missing[0], sources[missing[0]], None)  # raises, naming the path
  if not root.is_dir():
    raise FileNotFoundError(
        f"{ENV_VAR}={root} is not a folder: point it at the folder that holds the data "
        f"files ({GUIDE}), or unset it to download them")
  if not missing:
    return
  print(f"warning: {ENV_VAR}={root} holds no {missing[0]}; reading the copy prepared "
        f"before in {builder.data_path}", file=sys.stderr)


def prepare(make_builder):
  """A prepared TFDS builder from `make_builder()`, one process at a time per dataset.

  Two processes that find the same dataset unprepared (pytest-xdist workers,
  several training processes on one host) would both write it and race on
  TFDS's final rename. An exclusive `fcntl.flock` on a file beside the dataset's
  version folder serialises them, and the builder is made again inside the lock:
  one made before another process finished has read no dataset info, and would
  find no splits even after `download_and_prepare` skipped the finished work.
  Local file systems only (flock on NFS is not reliable; a gs:// data dir takes
  no lock).
  """
  import fcntl

  first = make_builder()
  check_sources(first)
  parent = os.path.dirname(os.fspath(first.data_dir))
  if "://" in parent:
    builder = make_builder()
    _download_and_prepare(builder)
    return builder
  os.makedirs(parent, exist_ok=True)
  with open(os.path.join(parent, ".prepare.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      builder = make_builder()
      _download_and_prepare(builder)
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  return builder


# Set (to anything but "" or "0") by train's and eval's --data_progress: TFDS's own
# progress bars and messages while a dataset is prepared, instead of one line.
VERBOSE_ENV_VAR = "ATTNSCALE_DATA_PROGRESS"


def _download_and_prepare(builder) -> None:
  """`builder.download_and_prepare()`, quiet: a dataset prepared here says so in one
  line (TFDS prints about ten of progress bars); its output is shown only if the
  preparation fails, or always with $ATTNSCALE_DATA_PROGRESS set."""
  # Not builder.is_prepared(): it warns of a version folder without dataset_info.json.
  prepared = os.path.exists(os.path.join(os.fspath(builder.data_dir), "dataset_info.json"))
  if prepared or os.environ.get(VERBOSE_ENV_VAR, "") not in ("", "0"):
    builder.download_and_prepare()
    return
  import contextlib
  import io
  import time

  import tensorflow_datasets as tfds
  start, out = time.perf_counter(), io.StringIO()
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
      builder.download_and_prepare()
  except BaseException:
    sys.stderr.write(out.getvalue())
    raise
  finally:
    tfds.enable_progress_bar()
  print(f"prepared the dataset {builder.name} in {builder.data_dir} "
        f"({time.perf_counter() - start:.1f} s, once; --data_progress shows TFDS's output)",
        flush=True)
