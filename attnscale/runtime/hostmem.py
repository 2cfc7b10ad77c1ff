"""Host memory: transparent huge pages for malloc, so XLA's per-step buffers stop costing page faults.

XLA's CPU runtime allocates each step's buffers anew (one block for all the
activations kept for the backward pass: about 330 MB at the char LM's `cpu`
preset, 5.3 GB at `nanogpt`) and frees them at the end of the step. glibc serves
such blocks with fresh mmaps and unmaps them when freed, so every step the kernel
maps and zeroes every page again, 4 KiB at a time: 83,000 minor page faults and
about 150 ms of kernel time in a step of 200 ms at `cpu`, 1.4 million faults in a
step of 8.5 s at `nanogpt` (2 CPU cores). PyTorch's eager ops allocate blocks
small enough for malloc to recycle and never pay this.

glibc's `glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) asks the kernel for
transparent huge pages on malloc's mmaps, which cuts those faults 512-fold (the
kernel still zeroes each fresh page): the `cpu` step takes about 150 ms and the
`nanogpt` step 4.4 s. It changes page size only, not where blocks go, so memory
use does not grow. A tunable is read when the process starts, so
`reexec_with_tunables` re-executes the current command with it set; train.py,
eval.py and the benchmarks call it first thing.

Huge pages still leave the kernel zeroing each fresh 2 MB page: 40-80 ms of
system time in a `cpu`-preset step on 2 cores (docs/benchmarks.md). The default therefore
keeps freed memory for the next step: one heap, never handed back by free()
(arena_max=1, mmap_max=0, no automatic trimming), so a steady step reuses the
last step's pages and pays no faults at all: 189.6 -> 171.0 ms a step at `cpu`
(2 cores, quiet; docs/benchmarks.md), and 4-5 ms of a 32 ms one-core step at
`graphcore_cpu`. Left alone, that heap would keep every page the process ever
touched, so train.py calls `trim()` (glibc's malloc_trim) after the first step,
each progress line, each evaluation and each checkpoint; the next step faults
its own pages in once. The price is memory: train.py at `cpu` (150 steps,
evaluations and checkpoints) peaked at 2.4 GB resident, during compilation,
against 1.4 GB with "huge", and held 0.9-1.9 GB while training against 1.0-1.3
GB. At `graphcore_cpu` both held 0.9 GB.

ATTNSCALE_MALLOC picks the setting:
  reuse (default): huge pages and one heap reused step after step, trimmed
    as above. Other allocators' long-lived blocks share that heap: with PyTorch
    in the same process (the throughput benchmark's --in_process) or where
    memory is tight (a large model on CPU), prefer "huge";
  huge: glibc.malloc.hugetlb=1 only (less memory, slower steps);
  system: glibc's defaults.
Nothing happens off Linux/glibc, when the kernel's THP mode is not "madvise" (with
"always" pages are huge already; huge pages only: "reuse" still applies its
other settings), or when GLIBC_TUNABLES is already set (the user's choice wins).

A notebook kernel cannot re-execute itself, so a notebook that trains in its
kernel runs on glibc's defaults (about 0.7x train.py's speed at `cpu`). This
installs a Jupyter kernel that starts with the tunables set
(docs/benchmarks.md, "Notebook kernels"):

  python -m attnscale.runtime.hostmem install-kernel [--user] [--mode=reuse]

then pick "Python (attnscale)" in JupyterLab (Kernel > Change Kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import tempfile

MODES = {
    "huge": "glibc.malloc.hugetlb=1",
    "reuse": ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
              "glibc.malloc.trim_threshold=18446744073709551615"),
    "system": "",
}
DEFAULT = "reuse"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _libc():
  return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _glibc_version() -> tuple[int, ...] | None:
  try:
    libc = _libc()
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return tuple(int(x) for x in libc.gnu_get_libc_version().decode().split(".")[:2])
  except (OSError, AttributeError, ValueError):
    return None  # not glibc (musl, macOS)


def _thp_mode() -> str | None:
  """The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled."""
  try:
    text = open(_THP_MODE).read()
  except OSError:
    return None
  return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


def tunables_environ(mode: str | None = None, environ=None) -> dict[str, str] | None:
  """The environment to re-execute with, or None when there is nothing to do.

  mode: a key of MODES; None reads ATTNSCALE_MALLOC (default DEFAULT).
  """
  environ = dict(os.environ if environ is None else environ)
  mode = mode or environ.get("ATTNSCALE_MALLOC") or DEFAULT
  if mode not in MODES:
    raise ValueError(f"ATTNSCALE_MALLOC must be one of {list(MODES)}, got {mode!r}")
  tunables = MODES[mode]
  if _thp_mode() != "madvise":
    tunables = ":".join(t for t in tunables.split(":") if "hugetlb" not in t)
  if (not tunables or "GLIBC_TUNABLES" in environ or not sys.platform.startswith("linux")):
    return None
  version = _glibc_version()
  if version is None or version < (2, 35):
    return None
  environ["GLIBC_TUNABLES"] = tunables
  return environ


def reexec_with_tunables(mode: str | None = None) -> None:
  """Re-executes this process's command line with the malloc tunables of `mode`.

  Call it before anything else happens (no threads, no files written): the new
  process starts from scratch, with the same interpreter options and arguments,
  and GLIBC_TUNABLES set, so it does not re-execute again.
  """
  environ = tunables_environ(mode)
  if environ is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)


def trim() -> None:
  """Hands the heap's free pages back to the kernel (glibc's malloc_trim(0)).

  Under "reuse" free() never does, so a process would keep every page it ever
  touched; train.py and packed sweeps call this after the first step, progress
  lines, evaluations and checkpoints (milliseconds; the next step faults its own
  pages in once). A no-op off glibc.
  """
  try:
    _libc().malloc_trim(0)
  except (OSError, AttributeError):
    pass  # not glibc


KERNEL_NAME = "attnscale"


def kernel_spec(mode: str | None = None) -> dict:
  """A Jupyter kernelspec (kernel.json) for this interpreter whose environment holds
  the malloc tunables of `mode` (read when the kernel process starts, as in
  `reexec_with_tunables`); without tunables to set, a plain ipykernel spec."""
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "Python (attnscale)", "language": "python",
          "metadata": {"debugger": True}}
  environ = tunables_environ(mode, environ={})
  if environ is not None:
    spec["env"] = {"GLIBC_TUNABLES": environ["GLIBC_TUNABLES"]}
  return spec


def install_kernel(*, user: bool = False, prefix: str | None = None,
                   mode: str | None = None) -> str:
  """Installs `kernel_spec(mode)` as the Jupyter kernel "attnscale"; returns its folder.

  Default: into this environment (sys.prefix/share/jupyter/kernels), where a
  `jupyter lab` of the same environment finds it; `user`: the user's kernels.
  """
  from jupyter_client.kernelspec import KernelSpecManager  # ipykernel's dependency
  with tempfile.TemporaryDirectory() as folder:
    with open(os.path.join(folder, "kernel.json"), "w") as f:
      json.dump(kernel_spec(mode), f, indent=1)
    return KernelSpecManager().install_kernel_spec(
        folder, KERNEL_NAME, user=user, prefix=None if user else (prefix or sys.prefix))


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m attnscale.runtime.hostmem",
      description="install-kernel: a Jupyter kernel that trains at train.py's speed")
  parser.add_argument("command", choices=["install-kernel"])
  parser.add_argument("--user", action="store_true", help="the user's kernels, not this env's")
  parser.add_argument("--prefix", help="install under PREFIX/share/jupyter/kernels")
  parser.add_argument("--mode", choices=list(MODES), help="default: ATTNSCALE_MALLOC or reuse")
  args = parser.parse_args(argv)
  folder = install_kernel(user=args.user, prefix=args.prefix, mode=args.mode)
  env = kernel_spec(args.mode).get("env", {})
  print(f"installed the Jupyter kernel {KERNEL_NAME!r} (\"Python (attnscale)\") in {folder}"
        + (f" with GLIBC_TUNABLES={env['GLIBC_TUNABLES']}" if env else
           " (no malloc tunables apply on this machine: a plain kernel)"))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
