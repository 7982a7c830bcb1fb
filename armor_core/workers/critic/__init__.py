"""The critic worker: ``CriticWorker`` and PPO's value loss (``worker``), the value model (``values``)."""
