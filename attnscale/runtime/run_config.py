"""The runtime's name for a run's config read once: `attnscale.config.run`.

    run = run_config.read(config, num_devices)   # train.py, a packed sweep: validated
    run = run_config.of(config_or_run)           # a test or a tool: unchecked
"""

from attnscale.config.run import TRACED_FIELDS, RunConfig, of, read  # noqa: F401
