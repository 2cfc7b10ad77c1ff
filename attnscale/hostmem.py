"""Host memory: make glibc's malloc reuse freed memory instead of returning it to the OS.

XLA's CPU runtime allocates each step's buffers anew (hundreds of MB for the
activations kept for the backward pass) and frees them at the end of the step.
With glibc's defaults those blocks come from fresh mmaps or per-thread heaps that
are handed back to the kernel when freed, so every step touches new pages: at the
`cpu` preset of the char LM that was 83,000 minor page faults and about 150 ms of
kernel time per step, in a step of about 200 ms (2 CPU cores). PyTorch's eager
ops allocate small blocks that malloc already recycles, so it never paid this.

`reuse_freed_memory` sets three malloc options (one arena, no mmap for large
blocks, no trimming of the heap's top), after which freed blocks are reused and
the steady state has almost no page faults. The cost: the process keeps its peak
heap until it exits, as PyTorch's caching allocator does. GLIBC_TUNABLES set by
the user (e.g. `glibc.malloc.hugetlb=1`, transparent huge pages for the heap)
still apply. Call it early, before JAX starts its thread pools (the arena limit
applies to threads that have not allocated yet); train.py, eval.py and the
benchmarks do. Set ATTNSCALE_SYSTEM_MALLOC=1 to keep glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def reuse_freed_memory() -> bool:
  """Configures glibc malloc to keep and reuse freed memory; True if it did.

  A no-op (False) off Linux, with another C library, or when the environment
  sets ATTNSCALE_SYSTEM_MALLOC=1.
  """
  if not sys.platform.startswith("linux") or os.environ.get("ATTNSCALE_SYSTEM_MALLOC") == "1":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
    libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt options)
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  ok = mallopt(_M_ARENA_MAX, 1)  # threads share the main heap, which is never unmapped
  ok &= mallopt(_M_MMAP_MAX, 0)  # large blocks come from that heap too, not from mmap
  ok &= mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # and freed memory is not handed back
  return bool(ok)
