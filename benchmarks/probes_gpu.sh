#!/usr/bin/env bash
# The length probes at a GPU size (benchmarks/gpu_session.sh `probes`): softmax with the
# standard scaling and with log_n on configs/probes.py's mqar_gpu and max_retrieval_gpu,
# each trained at its length, then eval.py at 1x-16x (pairs grown and fixed for MQAR).
#   bash benchmarks/probes_gpu.sh WORKDIR     # WORKDIR/<preset>-<scaling>/ per run
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:?WORKDIR}
PY=${PY:-python3}
# The standard scaling on both tasks first: a session's time limit that stops the
# script early has both sanity rows before any comparison.
for scaling in standard log_n; do
  for preset in mqar_gpu max_retrieval_gpu; do
    case $preset in
      mqar_gpu) lengths=256,512,1024,2048,4096 ;;
      *) lengths=64,128,256,512,1024 ;;
    esac
    workdir=$root/$preset-$scaling
    $PY train.py --config="configs/probes.py:preset=$preset,scaling=$scaling" --workdir="$workdir"
    $PY eval.py --workdir="$workdir" --lengths=$lengths
  done
done
