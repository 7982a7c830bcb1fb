"""Built-in advantage estimators, one module per entry point (``grpo``, ``gae``, ``rloo``, ...); the
helpers they share are public, in ``armor_core.ops.groups`` and ``armor_core.ops.masked``."""
