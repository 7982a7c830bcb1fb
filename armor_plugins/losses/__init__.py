"""Built-in policy losses (``ppo_clip``, ``gspo``, ``cispo``), KL estimators and controllers (``kl``),
loss aggregation (``aggregation``); shared masked-tensor helpers in ``utils``."""
