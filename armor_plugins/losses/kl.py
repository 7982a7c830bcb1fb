"""The built-in KL(pi || pi_ref) estimators, ``k1``, ``k2``, ``k3``, ``abs``, ``k1+``, ``k3+``, ``abs+``: config
values of ``algorithm.kl_penalty`` and ``actor.kl_loss_type``. Their math, with the table of what each estimates
and why the ``+`` variants exist, is ``armor_core.ops.kl``; this module registers it.
"""

from __future__ import annotations

from armor_core import KLEstimator, hookimpl
from armor_core.hookspecs import RegisterKLEstimator
from armor_core.ops.kl import KL_ESTIMATORS

__all__: list[str] = []


@hookimpl
def armor_register_kl_estimators(register: RegisterKLEstimator) -> None:
    for name, fn in KL_ESTIMATORS.items():
        register(name, KLEstimator(fn=fn, description=(fn.__doc__ or "").split("\n")[0]))
