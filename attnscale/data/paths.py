"""Local copies of raw data files, for machines without network access.

`$ATTNSCALE_DATA` may point at a folder laid out like

    tinyshakespeare/input.txt
    wikitext-2/{train,valid,test}.txt
    wikitext-103/{train,valid,test}.txt   (optional; no known sha256: read unchecked)

When it is set, the dataset builders read their source files from there and
never touch the network; when it is unset they download (with a checksum check).
Every local copy is checked against the same sha256 as a download would be, so a
run never silently trains on a different file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

ENV_VAR = "ATTNSCALE_DATA"


def data_root() -> pathlib.Path | None:
  """The folder named by `$ATTNSCALE_DATA`, or None when it is unset or empty."""
  root = os.environ.get(ENV_VAR, "")
  return pathlib.Path(root).expanduser() if root else None


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

  parent = os.path.dirname(os.fspath(make_builder().data_dir))
  if "://" in parent:
    builder = make_builder()
    builder.download_and_prepare()
    return builder
  os.makedirs(parent, exist_ok=True)
  with open(os.path.join(parent, ".prepare.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      builder = make_builder()
      builder.download_and_prepare()
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  return builder
