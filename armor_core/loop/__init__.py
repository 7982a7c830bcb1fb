"""The RL loop on the driver: ``trainer`` (the run), ``step`` (one step, stage by stage) and its collaborators:
``rollout_source`` and ``async_rollout`` (where rows come from), ``guard`` (the StabilityGuard runner),
``kl_penalty`` (the in-reward KL penalty), ``validation``, ``step_timer``, ``faults`` (injection for tests and
benchmarks), ``data`` (datasets) and ``preflight`` (driver-side checks before any worker starts).
"""
