#!/usr/bin/env bash
# The checks only a GPU can make, in one short call (a lent machine's minutes are few):
#   0. (`nanogpt`, first in the queue) the nanogpt preset, nanoGPT's shakespeare_char
#      (one A100: best validation loss 1.4697), in bfloat16 as nanoGPT trains on a GPU and
#      with its 200-batch estimate (eval_iters=200), then eval.py (whole split, sink rate)
#      and benchmarks/baseline_summary.py's row beside 1.4697; $OUT/nanogpt/ keeps
#      metrics.jsonl, config.json and eval.json (docs/getting-started.md's table);
#   0b. (`probes`, second in the queue) the length probes at a GPU size (configs/probes.py
#      mqar_gpu, max_retrieval_gpu): softmax with the standard scaling and with log_n,
#      trained at 256 / 64 tokens and evaluated at 1x-16x (eval.py --lengths): does
#      attention solve MQAR in distribution at Zoology's size, and does a fixed
#      temperature lose the maximum as the items grow? $OUT/probes/<run>/ keeps
#      metrics.jsonl, config.json and eval.json;
#   1. the attention and kernel tests on the GPU (cuDNN for every scaling, fused ==
#      reference, causality, kernel options, precision, packing);
#   2. benchmarks/attention.py in bfloat16: which kernel each scaling compiles to, time
#      and peak memory, measured;
#   3. benchmarks/train_throughput.py: measured step time and MFU at cpu, nanogpt and
#      GPT-2 small's body (compare with compile.py's roofline for the same shapes);
#   4. benchmarks/sweep_throughput.py: runs per hour of packed sweeps on one GPU;
#   5. (by name only: `dropout`) nanogpt's train step with dropout 0.2: does drawing
#      its masks (XLA's fused threefry) slow the GPU compile, as it did the init's?
#   6. (by name only: `finish`) finish a CPU sweep here: SWEEP=transfer
#      RAW=docs/results/transfer/runs.parquet bash benchmarks/gpu_session.sh finish
#      unpacks the study's results store into a workdir, runs the rest of the sweep packed (PACK=32,
#      JOBS=6, float32 at full matmul precision, no --evaluate: an eval.py process a
#      point costs more than its training here; ONLY=width256: only the points whose
#      name matches, e.g. those that cost a CPU most; SWEEP=transfer_512 ONLY=width512:
#      the transfer study's width-512 searches, once width 256 is done) and archives each point to
#      $OUT/raw as it finishes (a pack still compiling when the limit's Ctrl-C comes
#      ignores it until the KILL), returned as one file, $OUT/raw.tgz. XLA's GEMM
#      autotuning is off
#      (--xla_gpu_autotune_level=0): these packs are small and compile-bound (66-143 s
#      a pack with it on, on the H100, 2026-11-27). Stop the CPU sweep first; back home,
#      replace each returned point's run directory with its records
#      (docs/guides/sweeps.md, "A CPU sweep finished on a GPU").
#
#   bash benchmarks/gpu_session.sh            # every step, on a GPU machine with the deps
#   bash benchmarks/gpu_session.sh train sweep  # some of them
#   LIMIT_train=400 bash benchmarks/gpu_session.sh train   # another time limit (seconds)
#   SIZES=gpt2 PACKS=8 bash benchmarks/gpu_session.sh train sweep  # the train sizes, the packs
#
# Each step has its own time limit and log ($OUT/<step>.log, default /tmp/gpu_session);
# the end of each log is printed. A machine without the project's pip dependencies
# can be handed them as .gpu/site.tgz (a site-packages subset, unpacked onto
# PYTHONPATH) and the data as .gpu/data.tgz (unpacked into ATTNSCALE_DATA).
# For an image that has JAX, flax, optax and orbax but not the rest (2026-11-27's), made
# from a Python 3.12 virtual environment of the project (.venv312):
#   (cd .venv312/lib/python3.12/site-packages && tar -czf - array_record dm_tree-*.dist-info \
#     tree docstring_parser google immutabledict importlib_resources ml_collections promise \
#     simple_parsing tensorboardX tensorflow_datasets tensorflow_metadata termcolor toml) > .gpu/site.tgz
#   (cd "$ATTNSCALE_DATA" && tar -czf - tinyshakespeare) > .gpu/data.tgz
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if [ -f .gpu/site.tgz ]; then
  mkdir -p /tmp/site && tar -xzf .gpu/site.tgz -C /tmp/site
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -f .gpu/data.tgz ]; then
  mkdir -p /tmp/data && tar -xzf .gpu/data.tgz -C /tmp/data && export ATTNSCALE_DATA=/tmp/data
fi
# Several processes share the GPU (pytest's workers, a sweep's jobs): no preallocation.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
export ATTNSCALE_TEST_XLA_OPT=1  # the tests' -O0 is for XLA:CPU's compile time only
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nproc
  $PY -c "import jax, jaxlib, flax, optax; print('jax', jax.__version__, 'jaxlib', \
jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"
} 2>&1 | tee "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...: runs it under a limit (LIMIT_NAME overrides), logs
  local name=$1 limit=$2 start rc over="LIMIT_$1"
  limit=${!over:-$limit}
  shift 2
  start=$(date +%s)
  # SIGINT first: pytest then stops its workers and prints its summary; KILL 15 s later.
  # Its own process group, so that what it leaves running (workers) is ended with it.
  setsid timeout -s INT -k "${KILL_AFTER:-15}" "$limit" "$@" > "$OUT/$name.log" 2>&1 &
  local pid=$!
  wait $pid
  rc=$?
  kill -KILL -- -$pid 2>/dev/null
  echo "== $name: exit $rc after $(( $(date +%s) - start )) s (limit $limit)"
  case $name in tests*)  # pytest -v: counts so far, even when the limit stopped it
    echo "   PASSED $(grep -c ' PASSED ' "$OUT/$name.log") FAILED $(grep -c ' FAILED ' "$OUT/$name.log")" \
         "SKIPPED $(grep -c ' SKIPPED ' "$OUT/$name.log") ERROR $(grep -c ' ERROR ' "$OUT/$name.log")"
    grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | cut -c1-300 | head -n 20 ;;
  *) grep -E "^\||^#|rror" "$OUT/$name.log" | grep -v "^# *$" | tail -n "${TAIL:-45}" ;;
  esac
}

PYTEST=($PY -m pytest -p no:cacheprovider -o addopts= -m "not slow and not heavy and not accelerator"
        -n "${WORKERS:-8}" --dist loadscope -v -rfE --tb=line)
run() {  # run STEP: one of the steps below
  case $1 in
  tests_attention) step $1 120 "${PYTEST[@]}" tests/test_attention.py tests/test_kernel_options.py ;;
  tests_more) step $1 120 "${PYTEST[@]}" tests/test_causality.py \
      tests/test_scalings.py tests/test_xla_attention.py tests/test_attention_options.py \
      tests/test_temperature_scalings.py tests/test_mixed_precision.py tests/test_precision.py \
      tests/test_packed.py ;;
  nanogpt) rm -rf /tmp/nanogpt && mkdir -p "$OUT/nanogpt" && step $1 480 bash -c "$PY train.py \
      --config=configs/shakespeare_char.py:preset=nanogpt --workdir=/tmp/nanogpt \
      --config.model.dtype=bfloat16 --config.eval_batches=200 \
      && $PY eval.py --workdir=/tmp/nanogpt \
      && $PY benchmarks/baseline_summary.py --published 1.4697 /tmp/nanogpt"
    cp /tmp/nanogpt/{metrics.jsonl,config.json,eval.json} "$OUT/nanogpt/" 2>/dev/null ;;
  probes) rm -rf /tmp/probes && mkdir -p "$OUT/probes" \
      && step $1 300 env PY="$PY" bash benchmarks/probes_gpu.sh /tmp/probes
    for w in /tmp/probes/*/; do
      mkdir -p "$OUT/probes/$(basename "$w")" && cp "$w"{metrics.jsonl,config.json,eval.json} \
        "$OUT/probes/$(basename "$w")/" 2>/dev/null
    done ;;
  attention) step $1 90 $PY benchmarks/attention.py --dtype bfloat16 --seq 1024,4096 --iters 5 ;;
  train) step $1 240 $PY benchmarks/train_throughput.py --sizes "${SIZES:-gpt2,nanogpt,cpu}" \
      --frameworks jax --dtype bfloat16 --rounds 3 --steps 10 ;;
  dropout) step $1 150 $PY benchmarks/train_throughput.py --sizes nanogpt --frameworks jax \
      --dtype bfloat16 --rounds 3 --steps 10 --dropout 0.2 ;;  # warm-up vs train's nanogpt row
  finish) rm -rf /tmp/sweep_finish && mkdir -p /tmp/sweep_finish "$OUT/raw" \
      && $PY -m attnscale.experiments.results_store unpack \
        "${RAW:?RAW=a results store, docs/results/<study>/runs.parquet}" /tmp/sweep_finish \
      && ls /tmp/sweep_finish > /tmp/sweep_finish.had \
      && KILL_AFTER=${KILL_AFTER:-30} JAX_DEFAULT_MATMUL_PRECISION=highest \
      XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}" step $1 420 $PY sweep.py \
      --config="${CONFIG:-configs/shakespeare_char.py}" --sweep="${SWEEP:?SWEEP=a sweep name}" \
      --workdir=/tmp/sweep_finish --pack="${PACK:-32}" --jobs="${JOBS:-6}" \
      --archive_to="$OUT/raw" ${ONLY:+--only="$ONLY"}
    for d in "$OUT"/raw/*/; do  # only what is new comes back
      grep -qxF "$(basename "$d")" /tmp/sweep_finish.had && rm -rf "$d"
    done
    # One file: a lent machine returns only a few files from $OUT (the 2026-11-27 call
    # brought back 8 of 84). Unpack at home with tar -xzf raw.tgz.
    echo "   $(ls "$OUT/raw" | wc -l) newly finished points archived to $OUT/raw.tgz" \
      && tar -czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$OUT/raw" ;;
  sweep) step $1 150 $PY benchmarks/sweep_throughput.py --presets graphcore_cpu --packs "${PACKS:-1,8,32}" \
      --packs_jobs2= --steps 100 ;;
  *) echo "unknown step $1 (nanogpt, probes, tests_attention, tests_more, attention, train, dropout, sweep, finish)"; exit 2 ;;
  esac
}
# The default order puts first what has never run on a GPU (nanogpt, then the probes), then
# what the 2026-11-26 session could not finish in its minutes.
for s in "${@:-nanogpt probes train sweep tests_attention tests_more attention}"; do
  for one in $s; do run "$one"; done
done
