"""The whole plugin contract of ARMOR.

Every way to extend ARMOR is a hook in this file. Each hook is a *register collector*: ARMOR calls it
once per plugin with a ``register`` callable, and the plugin calls ``register(name, implementation)``
for each thing it provides. The host (``armor_core.plugins``) owns the catalog, so it can refuse
duplicate names, list everything (``armor plugins``) and suggest the nearest name for a typo.

The registered name is the value users write in the config (``algorithm.adv_estimator: grpo``);
keep it lowercase snake_case. What each implementation must look like is described per hook and
typed in ``armor_core.interfaces``. A plain callable is accepted where the hook says so and is
wrapped with default metadata.

A plugin module needs only::

    from armor_core import hookimpl
    from armor_core.hookspecs import RegisterAdvantageEstimator

    @hookimpl
    def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
        register("my_estimator", compute_my_advantage)

and an entry point in group ``armor`` in its distribution's ``pyproject.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import pluggy

if TYPE_CHECKING:  # the types only: importing them here would pull torch into `armor --help`
    import torch

    from armor_core.interfaces import (
        AdvantageEstimator,
        Environment,
        KLEstimator,
        LossAggregation,
        MetricTracker,
        PolicyLoss,
        RewardDomain,
        RewardResult,
        RolloutBackend,
        StabilityGuard,
        Task,
    )

PROJECT_NAME = "armor"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: ``register(name, implementation)`` with no kind attached; each hook below receives a typed registrar.
Register = Callable[[str, Any], None]


# One registrar type per kind, so that a type checker refuses registering a guard as an estimator. Each is
# called as ``register(name, implementation)``; the name is the value users write in the config.
class RegisterAdvantageEstimator(Protocol):
    def __call__(
        self, name: str, estimator: AdvantageEstimator | Callable[..., tuple[torch.Tensor, torch.Tensor]], /
    ) -> None: ...


class RegisterPolicyLoss(Protocol):
    def __call__(self, name: str, loss: PolicyLoss | Callable[..., tuple[torch.Tensor, dict[str, Any]]], /) -> None: ...


class RegisterKLEstimator(Protocol):
    def __call__(
        self, name: str, estimator: KLEstimator | Callable[[torch.Tensor, torch.Tensor], torch.Tensor], /
    ) -> None: ...


class RegisterLossAggregation(Protocol):
    def __call__(self, name: str, aggregation: LossAggregation | Callable[..., torch.Tensor], /) -> None: ...


class RegisterRewardDomain(Protocol):
    def __call__(self, name: str, domain: RewardDomain | Callable[..., float | RewardResult], /) -> None: ...


class RegisterStabilityGuard(Protocol):
    def __call__(self, name: str, guard_cls: type[StabilityGuard], /) -> None: ...


class RegisterRolloutBackend(Protocol):
    def __call__(self, name: str, backend_cls: type[RolloutBackend], /) -> None: ...


class RegisterTask(Protocol):
    def __call__(self, name: str, task: Task | Callable[..., list[dict[str, Any]]], /) -> None: ...


class RegisterMetricTracker(Protocol):
    def __call__(self, name: str, tracker_cls: type[MetricTracker], /) -> None: ...


class RegisterEnvironment(Protocol):
    def __call__(self, name: str, env_cls: type[Environment] | Callable[..., Environment], /) -> None: ...


__all__ = [
    "Register",
    "RegisterAdvantageEstimator",
    "RegisterEnvironment",
    "RegisterKLEstimator",
    "RegisterLossAggregation",
    "RegisterMetricTracker",
    "RegisterPolicyLoss",
    "RegisterRewardDomain",
    "RegisterRolloutBackend",
    "RegisterStabilityGuard",
    "RegisterTask",
    "armor_register_advantage_estimators",
    "armor_register_environments",
    "armor_register_kl_estimators",
    "armor_register_loss_aggregations",
    "armor_register_metric_trackers",
    "armor_register_policy_losses",
    "armor_register_reward_domains",
    "armor_register_rollout_backends",
    "armor_register_stability_guards",
    "armor_register_tasks",
    "hookimpl",
    "hookspec",
]


@hookspec
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    """Register advantage estimators (config key ``algorithm.adv_estimator``).

    :param register: call ``register(name, estimator)`` where ``estimator`` is an
        :class:`armor_core.interfaces.AdvantageEstimator` or a plain function
        ``fn(token_level_rewards, response_mask, index, **params) -> (advantages, returns)``.
        ``token_level_rewards``, ``response_mask``: (bs, response_length); ``index``: (bs,) int64
        group ids, the samples of one prompt share an id. Optional keyword parameters the
        function declares are filled from the config by name: ``values`` (bs, response_length)
        from the critic, ``gamma``, ``lam``, ``norm_adv_by_std``, ``reward_components`` (per row
        ``{domain: (score, weight)}``, the parts of its weighted score), and anything in
        ``algorithm.adv_kwargs``. Both outputs are (bs, response_length), zero outside the mask,
        and finite for every finite input. Set ``requires_critic=True`` on the
        ``AdvantageEstimator`` if ``values`` is required: the trainer then builds a critic. Set
        ``grouped=True`` if the estimator compares the samples of one prompt with each other (a
        group whose scores agree gets advantage 0): ``algorithm.filter_groups`` needs it, and so
        does ``adv_kwargs.normalize_components`` (each component standardised within its group
        before the weighted sum; the built-in grouped estimators do it with
        ``armor_core.ops.groups.normalize_reward_components``). Set ``greedy_baseline=True`` to
        receive ``baseline_scores`` (bs,), the score of the policy's greedy response to each row's
        prompt: the step generates and scores one per prompt, in the driver's step, before this call.
    """


@hookspec
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    """Register policy losses (config key ``actor.policy_loss``).

    :param register: call ``register(name, loss)`` where ``loss`` is an
        :class:`armor_core.interfaces.PolicyLoss` or a plain function
        ``fn(log_prob, old_log_prob, advantages, response_mask, **params) -> (loss_mat, metrics)``.
        All tensors are (bs, response_length); ``loss_mat`` is the per-token loss (bs,
        response_length) *before* aggregation, zero outside the mask, so that the core can
        aggregate it identically whole, in micro-batches or across data-parallel ranks.
        ``metrics`` maps names (``pg_clipfrac``, ``ppo_kl``, ...) to floats or 0-d tensors.
        Keyword parameters (``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``, anything in
        ``actor.policy_loss_kwargs``) are filled from the config by name.
    """


@hookspec
def armor_register_kl_estimators(register: RegisterKLEstimator) -> None:
    """Register KL estimators (config keys ``algorithm.kl_penalty``, ``actor.kl_loss_type``).

    :param register: call ``register(name, kl)`` where ``kl`` is an
        :class:`armor_core.interfaces.KLEstimator` or a plain function
        ``fn(log_prob, ref_log_prob) -> kl`` with all tensors (bs, response_length); the result is
        a per-token estimate of KL(policy || reference), differentiable in ``log_prob``.
    """


@hookspec
def armor_register_loss_aggregations(register: RegisterLossAggregation) -> None:
    """Register loss aggregation modes (config key ``actor.loss_agg_mode``).

    :param register: call ``register(name, agg)`` where ``agg`` is an
        :class:`armor_core.interfaces.LossAggregation` or a plain function
        ``fn(loss_mat, response_mask, *, global_num_tokens, global_num_seqs, norm_constant) -> loss``.
        ``loss_mat`` and ``response_mask`` are one micro-batch's (bs, response_length); the
        ``global_*`` counts are over the whole mini-batch on all data-parallel ranks (valid tokens;
        rows with at least one valid token) and ``norm_constant`` is ``actor.loss_norm_constant``.
        The contract that makes micro-batching and data parallelism exact: the *sum* of the
        returned 0-d losses over all micro-batches and ranks equals the loss of the whole batch
        computed at once. The worker sums micro-batch losses (it does not average them) and
        multiplies by the world size to undo DDP's gradient averaging.
    """


@hookspec
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    """Register reward domains (matched against each data row's ``data_source``).

    :param register: call ``register(name, domain)`` where ``domain`` is an
        :class:`armor_core.interfaces.RewardDomain` or a plain function
        ``fn(prompt, response, ground_truth, extra) -> float | RewardResult``. The domain's options
        (``inline``, ``warmup``, ``score_range``, ``validate_ground_truth``, ...) are fields of
        ``RewardDomain``. ``validate_ground_truth`` is called as ``check(ground_truth, extra)`` (two
        arguments, the second the row's ``extra`` even when the check ignores it) and raises
        ``ValueError`` for a ground truth the domain cannot score; a check that cannot take two
        arguments is refused here, naming the plugin.

    What ``fn`` receives: ``prompt`` is the row's prompt as text (a chat prompt, a list of
    messages, arrives as its JSON text); ``response`` the decoded response without special tokens;
    ``ground_truth`` the row's ``ground_truth`` (or ``reward_model.ground_truth``) as loaded, any
    JSON value; ``extra`` the row's ``extra`` dict (e.g. a multiple-choice question's options) plus
    ``response_length`` (tokens) added by the trainer. ``reward.domain_kwargs.<name>`` arrive as
    keyword arguments of ``fn`` (a key ``fn`` does not accept is an error at start); calling the
    registered ``RewardDomain`` as ``domain(prompt, response, ground_truth, extra, **params)`` scores a
    row as training does. ``fn`` must
    be deterministic and must not touch the network; a
    :class:`~armor_core.interfaces.RewardResult` carries named sub-scores that are logged as
    metrics (``reward/<domain>/<sub>``); ``score`` and ``failures`` are reserved sub-score names
    (the manager writes ``reward/<domain>/score`` and ``/failures`` itself). A ``fn`` that serves several
    data sources sets ``fn.wants_data_source = True`` and finds the row's in ``extra[DATA_SOURCE_KEY]``
    (``interfaces.CAPABILITIES`` lists every optional attribute of every kind). With multi-turn rollouts
    ``extra[EPISODE_KEY]`` holds how the row's episode went: why it ended, the environment's error, its
    metrics summed (a domain raising on a failed episode fails the row, counted like any failure).
    """


@hookspec
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    """Register stability guards (config key ``guard.guards``, an ordered list).

    :param register: call ``register(name, guard_cls)`` where ``guard_cls`` is a class following
        :class:`armor_core.interfaces.StabilityGuard`: built with the keyword parameters from the
        config, it is shown each stage's statistics and returns a
        :class:`~armor_core.interfaces.Verdict`, and saves its state with ``state_dict``. The
        stages are ``interfaces.GUARD_STAGES``: where each runs, the statistic keys it always
        carries, those it carries in some runs and the families named by prefix, and what each
        verdict does there (``honours``); the rest of the contract is ``interfaces.StabilityGuard``.

    Parameters: the class is built with ``guard.guards[i].params``. A constructor parameter named after
    an adjustable coefficient (``interfaces.ADJUSTABLE_COEFFICIENTS``: ``lr``, ``clip_ratio_low``,
    ``clip_ratio_high``, ``kl_loss_coef``, ``entropy_coeff``) that the params leave out is filled with the
    run's value (``actor.lr``, ...), so a guard that lowers a coefficient restores the run's own. Each
    listed guard is its own instance; a name listed twice is labelled ``name#i`` (its position) in its
    state, events and metrics, so two instances never share state. A refused parameter is a one-line
    ConfigError naming ``guard.guards[i]``, raised before any worker starts.

    Combining verdicts, per stage: severity is ``rollback`` > ``skip`` > ``scale`` > ``adjust`` >
    ``proceed``, and the most severe verdict wins (the first listed among equals); a winning rollback goes
    back to the earliest ``since`` any guard gave; the adjustments of every ``adjust`` verdict are merged,
    and when two guards set one coefficient the more cautious value wins (the lower ``lr`` and clip ranges,
    the higher ``kl_loss_coef`` and ``entropy_coeff``). Every verdict other than ``proceed`` is written to
    ``guard_events.jsonl`` and counted as ``guard/<label>/<action>``, and is carried out: a verdict its stage
    cannot honour (a ``skip`` at ``update``, a ``scale`` anywhere but ``grad``) is never logged as done. A guard
    may declare what it returns where (``actions = {"grad": ("skip",)}``): one that declares an action its
    stage cannot honour is a ConfigError naming ``guard.guards[i]`` before any worker starts; one that returns
    it anyway stops the run with a ``GuardVerdictError`` naming the guard, the stage and what would be right.
    """


@hookspec
def armor_register_rollout_backends(register: RegisterRolloutBackend) -> None:
    """Register rollout backends (config key ``rollout.backend``).

    :param register: call ``register(name, backend_cls)`` where ``backend_cls`` follows
        :class:`armor_core.interfaces.RolloutBackend`: built inside a worker from the model, the
        tokenizer and the rollout config, it generates responses for a DataProto of prompts and
        accepts new weights after each update.
    """


@hookspec
def armor_register_tasks(register: RegisterTask) -> None:
    """Register built-in tasks: datasets made in code (config key ``data.task``).

    :param register: call ``register(name, task)`` where ``task`` is an
        :class:`armor_core.interfaces.Task` or a plain function ``fn(split, size, seed, **params)
        -> list[dict]`` returning rows ``{"prompt", "data_source", "ground_truth", ...}``. The same
        ``(split, size, seed)`` must give the same rows, and the ``train`` and ``test`` splits must
        not overlap.
    """


@hookspec
def armor_register_environments(register: RegisterEnvironment) -> None:
    """Register environments for multi-turn rollouts (config key ``rollout.multi_turn.environment``).

    :param register: call ``register(name, env_cls)`` where ``env_cls`` follows
        :class:`armor_core.interfaces.Environment`: built per episode in the rollout worker from the
        dataset row, a seed and ``rollout.multi_turn.environment_kwargs``, it answers each assistant
        turn (:class:`~armor_core.interfaces.AssistantTurn`) with an
        :class:`~armor_core.interfaces.EnvironmentStep`: the next observation (text or chat messages,
        appended as tokens masked out of every loss), whether the episode is done, and reward parts
        that join the episode's reward components. ``reset`` and ``step`` may be ``async``. An optional
        static ``check_params(**params)`` is run in the driver at start. Whatever it raises ends only
        its own episode (counted). ``armor_core.testing.check_environment`` checks one before a run.
    """


@hookspec
def armor_register_metric_trackers(register: RegisterMetricTracker) -> None:
    """Register metric trackers (config key ``trainer.loggers``).

    :param register: call ``register(name, tracker_cls)`` where ``tracker_cls`` follows
        :class:`armor_core.interfaces.MetricTracker`: built with the run directory and the
        config, it receives a flat ``{name: float}`` dict each step and is closed at the end.
        It may define ``resume(step)``: called once after ``--resume`` restored the checkpoint of
        ``step``, before anything is logged; rows it kept for later steps are about to be logged
        again and should be dropped (``resume(-1)`` when no checkpoint was found: the run starts
        over, step 0 included); and ``summary(summary)``: called once at the end of a run
        with the contents of ``summary.json``.
    """
