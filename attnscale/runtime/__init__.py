"""Running experiments: what train.py, eval.py, sweep.py and compile.py stand on.

    configlib.py       the runtime's names for the config (attnscale/config): validate,
                       mesh_shape, the resume rules
    startup.py         one start-up: the config read, task, mesh, optimizer, state shapes
    config_reference.py  docs/reference/config.md, generated from the declarations
    cli.py             the entry points' flags: one-line errors (imports no JAX)
    config_files.py    which file --config names: a path, or a name in the project's configs/
    train_state.py     the train state, mesh and shardings (FSDP)
    optimizers.py      Adam(W), Muon, the schedule, clipping, muP's rate multipliers
    checkpoints.py     orbax checkpoints; damaged ones set aside, never deleted
    steps.py           the jitted train and eval steps
    loop.py            the training loop: one cadence (logs, evaluation, checkpoints,
                       preemption, the non-finite stop) for one run or a pack
    train_lib.py       one run (train.py): its one-slot program; rundir.py: a run
                       directory's lock, config.json, resume and init_from
    packing.py, packed.py  packed sweeps: which runs share a program; the R-slot program
    metric_keys.py     every key of metrics.jsonl and TensorBoard
    interrupts.py      SIGTERM and Ctrl-C; run_lock.py: one writer per run directory
    metrics_writer.py  metrics.jsonl and TensorBoard; trackers.py: W&B, trackio
    profiling.py       config.profile_steps: a jax.profiler trace of a few steps
    run_summary.py     the end-of-run lines (times, the next command)
    hostmem.py         malloc tunables
    provenance.py      WORKDIR/provenance.json: the commit, versions, devices and command
                       of each (re)start, and the files of config.imports
    aot.py             compiling for TPU slices and GPUs without them (targets/)
    hlo.py             reading compiled HLO: the attention kernel, collectives
    aot_report.py      compile.py's table and best-case training time

May import checks, fields, core, numerics, models, data, tasks and config.
"""
