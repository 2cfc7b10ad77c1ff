"""Training batches as random windows of one token stream, drawn once for every task.

nanoGPT's sampler: `batch_size` windows x = tokens[i:i+T], y = tokens[i+1:i+T+1]
at offsets i uniform over [0, len - T) (its torch.randint(len(data) - block_size)),
here drawn by `np.random.default_rng([seed, step])`, so a resumed run reads exactly
the windows an uninterrupted one would and every process draws the same global
offsets; process p keeps rows [p * B, (p + 1) * B), B = batch_size //
process_count. (NumPy keeps a Generator's stream fixed within a release, not
promised across releases: pin NumPy for bit-exact resumes.) A character stream in
memory (`char_lm.get_batch`) and a token stream on disk (`tokens.get_batch`) read
the windows at these offsets in their own way.

Dimension legend: G global batch (all processes), B this process's rows.
"""

from __future__ import annotations

import numpy as np


def window_starts(num_tokens: int, *, batch_size: int, seq_len: int, seed: int, step: int,
                  process_index: int = 0, process_count: int = 1) -> np.ndarray:
  """This process's window offsets (starts_B, int64) of the global batch for `step`.

  Args:
    num_tokens: the stream's length (at least seq_len + 1).
    batch_size: global batch size, over all processes.
    seq_len: window length T.
    seed: run seed (>= 0).
    step: training step (>= 0); each step gets fresh windows.
    process_index: this process, e.g. `jax.process_index()`.
    process_count: number of processes, e.g. `jax.process_count()`.

  Raises:
    ValueError: a bad argument, in one line naming it.
  """
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  if seed < 0 or step < 0:
    raise ValueError(f"seed and step must be >= 0, got seed={seed}, step={step}")
  if process_count <= 0 or batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count})")
  if num_tokens < seq_len + 1:
    raise ValueError(f"the stream has {num_tokens} tokens, fewer than seq_len + 1 = "
                     f"{seq_len + 1}")
  starts_G = np.random.default_rng([seed, step]).integers(
      0, num_tokens - seq_len, size=batch_size)
  B = batch_size // process_count
  return starts_G[process_index * B:(process_index + 1) * B]
