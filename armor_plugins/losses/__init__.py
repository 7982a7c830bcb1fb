"""Built-in policy losses (``ppo_clip``, ``gspo``, ``cispo``, ``sapo``, ``gmpo`` (``geo_mean``), ``gpg``,
``dppo`` (``dppo_tv``, ``dppo_kl``)), KL estimators and controllers (``kl``), loss aggregation
(``aggregation``); shared masked-tensor helpers in ``utils``."""
