"""The RL loop on the driver: ``trainer`` (the run), ``step`` (one step, stage by stage) and its collaborators:
``rollout_source`` and ``async_rollout`` (where rows come from), ``kl_penalty`` (the in-reward KL penalty),
``validation``, ``step_timer``, ``data`` (datasets), ``startup`` (starting the worker groups) and ``preflight``
(driver-side checks before any worker starts). The guard runner and fault injection, which the actor ranks use
too, are in ``armor_core.stability``.
"""
