"""Builds the native CPU kernels (flash_attention.cc, layer_norm.cc, one shared
library) at first use and registers their FFI targets with XLA.

The shared library is compiled on the user's machine by the system C++ compiler
($CXX, else c++, g++ or clang++) against XLA's FFI headers (`jax.ffi.include_dir()`),
with -O3 and the host's instruction set (-march=native; -mcpu=native on ARM), and
cached under $XDG_CACHE_HOME/attnscale/cpu_kernel (default ~/.cache/...), named by
a hash of the sources, the compiler's version, jaxlib's version and the CPU's
flags: a change to any of them builds anew, and two processes that build at once
each compile into their own temporary file and rename it into place (atomic),
under a file lock so that the second one reuses the first one's library.

Any failure (no compiler, a compile error, a library that does not load) gives
one warning line naming the cause and `load()` returns None, so the caller runs
XLA's kernels instead. ATTNSCALE_NATIVE_KERNEL=0 turns the kernels off without
building (tests of the fallback use it, or CXX=/bin/false).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(HERE, f) for f in ("flash_attention.cc", "layer_norm.cc"))
HEADERS = (os.path.join(HERE, "parallel.h"),)
ENV_SWITCH = "ATTNSCALE_NATIVE_KERNEL"
TARGETS = {"attnscale_flash_fwd": "AttnscaleFlashForward",
           "attnscale_flash_bwd": "AttnscaleFlashBackward",
           "attnscale_layer_norm_fwd": "AttnscaleLayerNormForward",
           "attnscale_layer_norm_bwd": "AttnscaleLayerNormBackward"}


def cache_dir() -> str:
  """$XDG_CACHE_HOME/attnscale/cpu_kernel, or ~/.cache/attnscale/cpu_kernel."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "attnscale", "cpu_kernel")


def compiler() -> str | None:
  """$CXX (taken as given, even if it fails), else the first of c++, g++, clang++ on PATH."""
  if os.environ.get("CXX"):
    return os.environ["CXX"]
  return next((shutil.which(c) for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def arch_flags() -> list[str]:
  machine = platform.machine().lower()
  return ["-mcpu=native"] if machine in ("arm64", "aarch64") else ["-march=native"]


def cpu_flags() -> str:
  """The host CPU's feature flags (/proc/cpuinfo), or its machine name elsewhere."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("flags", "Features")):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.machine() + " " + platform.processor()


def _compiler_version(cxx: str) -> str:
  out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
  if out.returncode != 0:
    raise RuntimeError(f"{cxx} --version failed (exit {out.returncode})")
  return out.stdout


def flags() -> list[str]:
  """The compiler's flags (part of the cache key)."""
  return ["-O3", *arch_flags(), "-std=c++17", "-shared", "-fPIC"]


def _compile(cxx: str, include_dir: str, out_path: str) -> None:
  cmd = [cxx, *flags(), "-I", include_dir, "-I", HERE, *SOURCES, "-o", out_path]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  if result.returncode != 0:
    first = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[0]
    raise RuntimeError(f"{os.path.basename(cxx)} failed: {first}")


@contextlib.contextmanager
def _file_lock(path: str):
  try:
    import fcntl
  except ImportError:  # not POSIX: the atomic rename alone keeps the cache sound
    yield
    return
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def library_path() -> str:
  """Builds the library if it is not cached yet; returns its path (raises on failure)."""
  import jax
  import jaxlib

  cxx = compiler()
  if cxx is None:
    raise RuntimeError("no C++ compiler (set CXX, or install g++ or clang++)")
  sources = []
  for name in SOURCES + HEADERS:
    with open(name, "rb") as f:
      sources.append(f.read())
  key = hashlib.sha256(b"\0".join([
      *sources, _compiler_version(cxx).encode(), jaxlib.__version__.encode(),
      cpu_flags().encode(), " ".join(flags()).encode()])).hexdigest()[:16]
  folder = cache_dir()
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"cpu_kernels-{key}.so")
  if os.path.exists(path):
    return path
  with _file_lock(path + ".lock"):
    if not os.path.exists(path):  # another process may have built it meanwhile
      fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
      os.close(fd)
      try:
        _compile(cxx, jax.ffi.include_dir(), tmp)
        os.replace(tmp, path)
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
  return path


@functools.cache
def load() -> ctypes.CDLL | None:
  """The built library with its FFI targets registered for the CPU, or None (warned once)."""
  if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
    return None
  try:
    import jax

    lib = ctypes.CDLL(library_path())
    for name, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                  platform="cpu")
    return lib
  except Exception as e:  # noqa: BLE001 - any failure means: run the XLA kernel instead
    cause = " ".join(str(e).split()) or type(e).__name__
    # warn_explicit with no source line to quote: the warning is one line.
    warnings.warn_explicit(f"the native CPU attention kernel and LayerNorm are unavailable "
                           f"({cause}); using XLA's", RuntimeWarning, "attnscale", 0)
    return None
