"""The random-window training batch is the same bits as before it had one home.

char_lm.get_batch (an array) and tokens.get_batch (a sharded stream) draw their
windows with one function (attnscale/data/windows.py); the digests below were
recorded from both before that, for a fixed token stream, seeds, steps and process
splits, so a change to the draw (and hence to every run's data order) fails here.
"""

import hashlib

import numpy as np
import pytest

from attnscale.data import char_lm, tokens

# (seed, step, batch_size, seq_len, process_index, process_count) -> the first 16
# hex digits of sha256(inputs bytes + targets bytes), and inputs[:, 0].
RECORDED = {
    (0, 0, 8, 16, 0, 1): ("cf984a255b2a693f", [64, 42, 111, 121, 237, 40, 44, 21]),
    (3, 17, 8, 16, 0, 1): ("83749b71f21249e0", [138, 76, 112, 86, 133, 95, 108, 112]),
    (3, 17, 8, 16, 1, 2): ("0dfbed80261ab7ab", [133, 95, 108, 112]),
    (5, 2, 12, 33, 2, 3): ("0103f8ad46f620c1", [5, 175, 247, 91]),
    (123, 100000, 4, 5002, 0, 1): ("c7905b8855b5d454", [0, 0, 0, 0]),
}
STREAM = ((np.arange(5003) * 7919) % 251).astype(np.uint16)


def _digest(batch) -> str:
  inputs_BxT, targets_BxT = batch
  assert inputs_BxT.dtype == targets_BxT.dtype == np.int32
  return hashlib.sha256(np.ascontiguousarray(inputs_BxT).tobytes()
                        + np.ascontiguousarray(targets_BxT).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("case", list(RECORDED))
def test_batches_match_the_recorded_ones(case):
  seed, step, batch_size, seq_len, process_index, process_count = case
  kwargs = dict(batch_size=batch_size, seq_len=seq_len, seed=seed, step=step,
                process_index=process_index, process_count=process_count)
  digest, first = RECORDED[case]
  from_array = char_lm.get_batch(STREAM.astype(np.int32), **kwargs)
  stream = tokens.TokenStream([STREAM[:1000], STREAM[1000:3001], STREAM[3001:]])
  from_shards = tokens.get_batch(stream, **kwargs)
  for batch in (from_array, from_shards):
    assert _digest(batch) == digest
    assert batch[0][:, 0].tolist() == first
