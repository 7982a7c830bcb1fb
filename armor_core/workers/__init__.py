"""What runs in the Ray worker processes, by role. ``api`` declares what the driver may call on them; ``common``
is process start-up and micro-batch splitting, shared by every worker; ``rollback_point`` a trainable rank's
rollback point in memory (actor and critic).

- ``actor/``: ``ActorWorker`` (``worker``) and its parts: the weights leaving and returning (``weights``), the
  optimizer step under the guards (``guarded_step``), the ``policy_kl`` probe (``policy_shift``), AdamW
  (``optim``) and the learning-rate schedule (``schedule``);
- ``losses/``: what the actor adds beside the policy-loss plugin: the KL loss (``kl_loss``), the distillation
  loss (``distill_loss``) and the rollout-correction weights (``rollout_correction``);
- ``critic/``: ``CriticWorker`` (``worker``) and the value model (``values``);
- ``rollout/``: ``build_rollout`` (``backend``: the backend a worker generates with), ``RolloutWorker``
  (``worker``, async mode), multi-turn episodes (``multi_turn``, ``observations``);
- ``forward/``: the forward passes' math: response log-probs and their layouts (``logprobs``, ``layouts``,
  ``prompt_groups``) and the chunked LM head (``lm_head``);
- ``parallel/``: data parallelism: the strategy's wrap and state (``strategy``), what ranks agree on
  (``collectives``), the compute dtype (``precision``);
- ``teacher``: ``TeacherWorker`` (on-policy distillation); ``reward_model``: ``RewardModelWorker``.

The sub-packages' ``__init__`` modules import nothing: import from the module (``armor_core.workers.actor.worker``).
"""
