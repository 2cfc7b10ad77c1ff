"""Metrics to TensorBoard event files and a plain JSON-lines log in the workdir."""

from __future__ import annotations

import json
import os

import jax


class MetricsWriter:
  """Writes scalars to WORKDIR/tensorboard (event files) and WORKDIR/metrics.jsonl.

  Only process 0 writes: the values are global (already averaged over devices).
  """

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tensorboardX import SummaryWriter  # writes event files without TensorFlow
    self.tb = SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))
    self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    for name, value in scalars.items():
      self.tb.add_scalar(name, value, step)
    self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self.jsonl.flush()

  def flush(self) -> None:
    if self.enabled:
      self.tb.flush()

  def close(self) -> None:
    if self.enabled:
      self.tb.close()
      self.jsonl.close()
