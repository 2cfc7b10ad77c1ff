"""The run directory's lock: one train.py writes to a --workdir at a time.

Two train.py processes on one run directory would both write its checkpoints,
metrics.jsonl and TensorBoard files, each over the other's. While a run trains,
WORKDIR/LOCK names it (one JSON line: host, process id, the process's start time,
since when, the command); process 0 of a multi-process run holds it for all.
The file is removed when the run ends in any way Python sees (the end, an error,
SIGTERM, Ctrl-C). A second train.py finds it and stops at start with one line
naming the holder. A hard kill (SIGKILL, the OOM killer, a lost machine) leaves
the file behind:

* from this host: a holder whose process is gone is taken over, with a note. A
  process id can be reused, so the holder counts as running only if a process
  with its id started when it did (Linux's /proc; elsewhere the id alone).
* from another host: whether it still runs cannot be seen from here. The error
  names it and the two ways out once that run is known to be over: rerun with
  --force_lock (train.py), or delete WORKDIR/LOCK.

The file is created with O_EXCL (atomic, also on NFS v3 and later), and the
check-and-take is serialised by an flock on the directory where the file system
has one, so of two processes racing for a stale lock only one takes it.
Imports no JAX.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time

LOCK_FILE = "LOCK"


class LockedError(ValueError):
  """Another run holds the lock; the one-line message names it and what to do."""


class RunLock:
  """WORKDIR/LOCK, held by this process from `acquire` to `release`.

  Args:
    workdir: the run directory (it must exist).
    force: take the lock whoever holds it (--force_lock), with a note.
    note: prints the one-line note of a takeover.
  """

  def __init__(self, workdir: str, *, force: bool = False, note=print):
    self.workdir, self.force, self.note = workdir, force, note
    self.path = os.path.join(workdir, LOCK_FILE)
    self.me = {"host": socket.gethostname(), "pid": os.getpid(),
               "pid_start": process_start(os.getpid()),
               "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}
    self.held = False

  def acquire(self) -> None:
    """Takes the lock, or raises LockedError (nothing in WORKDIR changed)."""
    with _serialised(self.workdir):
      holder = read(self.path)
      if holder is not None:
        self._check_takeover(holder)
        with contextlib.suppress(FileNotFoundError):  # released meanwhile
          os.remove(self.path)
      try:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
      except FileExistsError:  # taken between the read and here (no flock here)
        raise LockedError(self._in_use(read(self.path) or {})) from None
      try:
        with os.fdopen(fd, "w") as f:
          f.write(json.dumps(self.me) + "\n")
      except BaseException:  # a full disk, say: leave no empty lock behind
        os.remove(self.path)
        raise
    self.held = True

  def _check_takeover(self, holder: dict) -> None:
    """Returns if `holder`'s lock may be taken (saying so), else raises LockedError."""
    who = describe(holder)
    if self.force:
      self.note(f"note: --force_lock: taking over {self.path} from {who}")
    elif holder.get("host") == self.me["host"] and not running(holder):
      self.note(f"note: taking over {self.path} from {who}, which is no longer running")
    else:
      raise LockedError(self._in_use(holder))

  def _in_use(self, holder: dict) -> str:
    who = describe(holder)
    if not holder:
      return (f"--workdir {self.workdir} holds an unreadable {self.path}: if no run uses "
              "it, rerun with --force_lock or delete it")
    if holder.get("host") == self.me["host"]:
      return (f"--workdir {self.workdir} is in use by {who}: wait for that run to end "
              "(or stop it), or use another --workdir")
    return (f"--workdir {self.workdir} is locked by {who}, which cannot be checked from "
            f"here: if that run is over, rerun with --force_lock or delete {self.path}")

  def release(self) -> None:
    """Removes the file if it is still this process's (--force_lock may have taken it)."""
    if self.held:
      self.held = False
      holder = read(self.path) or {}
      if all(holder.get(k) == self.me[k] for k in ("host", "pid", "pid_start")):
        with contextlib.suppress(FileNotFoundError):  # deleted by hand meanwhile
          os.remove(self.path)

  def __enter__(self) -> RunLock:
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def read(path: str) -> dict | None:
  """The lock file's holder; {} if unreadable (torn, edited); None if absent."""
  try:
    with open(path) as f:
      holder = json.loads(f.read())
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return holder if isinstance(holder, dict) else {}


def describe(holder: dict) -> str:
  """`process 123 on host h (since 2025-01-01 12:00:00)`, as far as the file says."""
  return (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
          f"(since {holder.get('since', '?')})")


def running(holder: dict) -> bool:
  """Whether the holder's process (on this host) still runs."""
  pid = holder.get("pid")
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: it exists
    pass
  start = holder.get("pid_start")
  return start is None or process_start(pid) in (None, start)


def process_start(pid: int) -> int | None:
  """When process `pid` started, in clock ticks since boot (Linux), else None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      # Fields after the parenthesised name: state is field 3, starttime field 22.
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None


@contextlib.contextmanager
def _serialised(workdir: str):
  """An exclusive flock on the directory for the check-and-take (where it works)."""
  fd = os.open(workdir, os.O_RDONLY)
  try:
    with contextlib.suppress(OSError):  # no flock on this file system: O_EXCL alone
      fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)
