"""Ray worker processes: the actor (``actor``, ``actor_weights``, ``guarded_step``, ``optim``, ``schedule``,
``kl_loss``), the critic (``critic``, ``values``), rollout inside the actor (``rollout``, ``rollout_correction``),
the forward passes and their layouts (``logprobs``, ``lm_head``, ``layouts``, ``prompt_groups``, ``precision``) and
data parallelism (``parallel``, ``collectives``). ``api`` declares what the driver may call on them.
"""
