"""Built-in advantage estimators, one module per entry point (``grpo``, ``gae``, ``rloo``, ...); shared helpers in ``utils``."""
