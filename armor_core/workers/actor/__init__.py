"""The actor worker: ``ActorWorker`` (``worker``) with its weights (``weights``), guarded optimizer step
(``guarded_step``), ``policy_kl`` probe (``policy_shift``), optimizer (``optim``) and schedule (``schedule``)."""
