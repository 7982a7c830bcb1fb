"""Generation in the workers: ``build_rollout`` (``backend``), the async ``RolloutWorker`` (``worker``), multi-turn
episodes (``multi_turn``) and how an observation is appended (``observations``)."""
