"""Pure helpers for plugin authors: masked reductions (``masked``), group statistics and outcome scores
for advantage estimators (``groups``), length measures for reward domains (``lengths``), calls into code
ARMOR does not control, bounded in time and kept apart from what it raises (``calls``: tools, environments),
HTTP requests bounded in total time (``bounded_http``: reward services, judges, remote sandboxes), the
KL(pi || pi_ref) estimators and how they are applied under a mask (``kl``).

Public: the core and the built-in plugins use these, and so may any third-party estimator, loss or
reward domain. Import from the module (``from armor_core.ops.masked import masked_mean``).
"""
