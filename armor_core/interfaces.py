"""What each kind of plugin must provide.

``hookspecs.py`` says *how* to register; this module says *what* is registered. Function-like kinds
(estimators, losses, KL estimators, reward domains, tasks) are small frozen dataclasses around a
function plus the metadata the core needs, so the trainer never has to branch on a name: it asks
``estimator.requires_critic``, not ``name == "gae"``. A plain function registered for one of these
kinds is wrapped with default metadata. Class-like kinds (guards, rollout backends, trackers) are
classes following the protocols below.

Long module: the whole contract a plugin author reads (wrappers, protocols, guard stages, optional capabilities)
in one place, as ``hookspecs.py`` is the whole of how to register.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Iterable,
    Literal,
    Mapping,
    NamedTuple,
    Protocol,
    Sequence,
    TypeVar,
    runtime_checkable,
)

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from transformers import PreTrainedTokenizerBase

    from armor_core.dataproto.protocol import DataProto

_R = TypeVar("_R")

__all__ = [
    "ADJUSTABLE_COEFFICIENTS",
    "AssistantTurn",
    "CAPABILITIES",
    "Capability",
    "DATA_SOURCE_KEY",
    "EPISODE_KEY",
    "Environment",
    "EnvironmentStep",
    "Observation",
    "GUARD_STAGES",
    "GuardStage",
    "OPTIONAL_STATS",
    "KINDS",
    "AdvantageEstimator",
    "KLEstimator",
    "LossAggregation",
    "MetricTracker",
    "PolicyLoss",
    "RewardDomain",
    "RewardResult",
    "RolloutBackend",
    "StabilityGuard",
    "Task",
    "Verdict",
    "call_with_params",
    "capability",
    "ground_truth_check_problem",
]


@dataclass(frozen=True)
class AdvantageEstimator:
    """``fn(token_level_rewards, response_mask, index, **params) -> (advantages, returns)``.

    :param requires_critic: the estimator reads ``values``; the trainer builds a critic for it.
    :param grouped: the estimator compares the samples of one prompt (``index``) with each other,
        so a group whose scores all agree gets advantage 0 (``algorithm.filter_groups`` needs this).
    :param greedy_baseline: the estimator reads ``baseline_scores`` (bs,): the score of the current
        policy's greedy response to each row's prompt (ReMax). The step then generates one greedy
        response per prompt and scores it with the row's reward domains (timed as ``baseline``); those
        responses are not trained on.
    """

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    requires_critic: bool = False
    grouped: bool = False
    greedy_baseline: bool = False
    description: str = ""


@dataclass(frozen=True)
class PolicyLoss:
    """``fn(log_prob, old_log_prob, advantages, response_mask, **params) -> (loss_mat, metrics)``."""

    fn: Callable[..., tuple[torch.Tensor, dict[str, Any]]]
    description: str = ""


@dataclass(frozen=True)
class KLEstimator:
    """``fn(log_prob, ref_log_prob) -> kl`` per token, (bs, response_length)."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    description: str = ""


@dataclass(frozen=True)
class LossAggregation:
    """``fn(loss_mat, response_mask, *, global_num_tokens, global_num_seqs, norm_constant) -> loss``."""

    fn: Callable[..., torch.Tensor]
    description: str = ""


@dataclass(frozen=True)
class RewardResult:
    """A score and the named sub-scores that explain it (each logged as a metric)."""

    score: float
    sub_scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardDomain:
    """``fn(prompt, response, ground_truth, extra) -> float | RewardResult``.

    :param requires_ground_truth: rows routed to this domain must carry a ground truth; a row
        without one is rejected when the dataset is loaded, not at step 500.
    :param inline: the author declares ``fn`` pure Python, cheap and unable to hang, so it is
        scored in the calling process; otherwise every check runs in a worker process under
        ``reward.timeout_s`` (a process can be killed; a thread cannot).
    :param score_range: ``(low, high)``, the scores ``fn`` can return; a score outside it fails
        that row, naming the domain and the range. A function instead receives the domain's
        keyword parameters (defaults, then ``reward.domain_kwargs``) and returns the range, for
        scores the parameters move (``correct_score=2``). None: any finite score.
    :param warmup: optional ``fn() -> None`` a reward worker process runs once, before the domain's
        first timed check (e.g. importing a heavy library), so the import does not count against
        ``reward.timeout_s``. Not called for inline domains.
    :param validate_ground_truth: optional ``check(ground_truth, extra) -> None`` raising ``ValueError``
        (saying what would fit) for a ground truth the domain cannot score, e.g. a letter that is
        not among the row's options. Both arguments are passed by position: ``ground_truth`` as
        ``fn`` receives it, ``extra`` the row's ``extra`` dict (``{}`` when it has none); a check
        that needs only the first still takes both (``def check(ground_truth, extra)``), and one
        that cannot be called with two is refused when the plugin registers. Called on every row with
        a ground truth routed to the domain when the dataset is loaded (and by ``armor reward``
        before it scores): such a row is an error naming it (or, with ``data.skip_invalid``, a
        counted skip), not a failed score at every step. Any other exception it raises is the
        check's own bug, an error naming the domain.
    :param batch_fn: optional ``fn(prompts, responses, ground_truths, extras) -> list[float | RewardResult]``,
        one result per row, for checks that are faster on many rows at once (a model, a service). When
        set, the reward manager sends all of a batch's rows of this domain to a reward worker in one
        call, under ``reward.timeout_s`` for the whole call (an inline domain's in the driver); ``fn`` still
        scores single rows. In a row's place it may return an exception: that row fails with it.

    Optional, on ``fn`` itself: ``wants_data_source = True`` (a function attribute, or a class attribute of a
    callable object) hands ``fn`` each row's ``data_source`` in ``extra[DATA_SOURCE_KEY]``, for one function that
    serves several data sources. Every optional attribute of every kind is in ``CAPABILITIES``.
    """

    fn: Callable[[str, str, Any, Mapping[str, Any]], float | RewardResult]
    requires_ground_truth: bool = True
    inline: bool = False
    description: str = ""
    score_range: tuple[float, float] | Callable[[Mapping[str, Any]], tuple[float, float]] | None = (0.0, 1.0)
    validate_ground_truth: Callable[[Any, Mapping[str, Any]], None] | None = None
    warmup: Callable[[], object] | None = None  # what it returns is not read (a model's load returns the model)
    batch_fn: Callable[..., Sequence[float | RewardResult | Exception]] | None = None

    def __call__(
        self, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any] | None = None, **params: Any
    ) -> RewardResult:
        """Score one row as training does; ``params`` are the domain's keyword parameters
        (``reward.domain_kwargs.<name>``), passed to ``fn``."""
        out = self.fn(prompt, response, ground_truth, dict(extra or {}), **params)
        if isinstance(out, RewardResult):
            return out
        return RewardResult(score=out)  # kept as returned: the reward manager refuses a str, where float() would not


def ground_truth_check_problem(check: object) -> str | None:
    """Why ``check`` (a ``RewardDomain.validate_ground_truth``) cannot be called as ``check(ground_truth,
    extra)``, or None when it can (or is None)."""
    if check is None:
        return None
    name = getattr(check, "__qualname__", None) or repr(check)
    expected = (
        "it is called as validate_ground_truth(ground_truth, extra) (extra: the row's `extra` dict) and raises "
        "ValueError for a ground truth the domain cannot score"
    )
    if not callable(check):
        return f"validate_ground_truth is {type(check).__name__}, not a function; {expected}"
    try:
        inspect.signature(check).bind(None, {})
    except TypeError as e:
        return f"its validate_ground_truth {name} cannot take (ground_truth, extra) ({e}); {expected}"
    except ValueError:  # a builtin without a signature: it is tried when the rows load
        return None
    return None


@dataclass(frozen=True)
class Task:
    """``fn(split, size, seed, **params) -> list[dict]`` rows with prompt, data_source, ground_truth."""

    fn: Callable[..., list[dict[str, Any]]]
    description: str = ""


VerdictAction = Literal["proceed", "skip", "scale", "adjust", "rollback"]

#: coefficients a guard's ``adjust`` verdict may set (absolute values; ``lr`` is the base rate the schedule scales)
ADJUSTABLE_COEFFICIENTS = ("lr", "clip_ratio_low", "clip_ratio_high", "kl_loss_coef", "entropy_coeff")


#: what a verdict does where the driver acts on it before the update (stages ``reward`` and ``advantage``)
_BEFORE_UPDATE = {
    "skip": "this step's update is not made (nor the critic's)",
    "rollback": "the update is not made, and the newest rollback point or checkpoint older than ``since`` is restored",
    "adjust": "applied on every actor rank before this step's update",
}
#: what a verdict does where the driver acts on it after the update (stages ``update`` and ``validation``)
_AFTER_UPDATE = {
    "rollback": "the newest rollback point or checkpoint older than ``since`` is restored",
    "adjust": "applied on every actor rank from the next update on",
}
#: statistics of the rollout that stage ``advantage`` carries in some runs
_ROLLOUT_BEFORE_UPDATE = {
    "rollout/entropy": "the backend returned the sampler's log-probs, as every built-in does",
    "rollout/kept_mass": "sampling truncates (rollout.top_p < 1 or rollout.top_k > 0) and the backend returned the "
    "kept sets' mass, as every built-in does",
    "rollout/logprob_diff_mean": "the driver computed old log-probs (the update is not exactly on-policy) and the "
    "backend returned its log-probs",
    "rollout/logprob_diff_max": "as rollout/logprob_diff_mean",
    "rollout/staleness_mean": "rollout.mode=async",
    "rollout/staleness_max": "rollout.mode=async",
    "rollout/policy_version": "rollout.mode=async",
}
#: the same at stage ``update``, where the actor has measured the log-prob gap on its first mini-batch
_ROLLOUT_AFTER_UPDATE = {
    **_ROLLOUT_BEFORE_UPDATE,
    "rollout/logprob_diff_mean": "the backend returned its log-probs",
    "rollout/logprob_diff_max": "the backend returned its log-probs",
}


#: statistics that cost work to measure, so a stage carries them only when a guard lists them in ``needs``:
#: name -> the stage that carries them (``GUARD_STAGES[stage].optional`` says when)
OPTIONAL_STATS: dict[str, str] = {
    # KL(before || after) of one optimizer step, nats per token, on a probe of the rows it was trained on
    # (``workers/actor/policy_shift.py``): one forward of a few rows per measured step
    "policy_kl": "step",
}


class GuardStage(NamedTuple):
    """One stage of a step shown to the guards.

    :ivar where: where and when it runs.
    :ivar keys: the statistics it always carries.
    :ivar optional: ``{key: when}``, statistics it carries only in some runs.
    :ivar families: ``{prefix: what}``, statistics named ``<prefix>...`` whose names depend on the configured
        plugins or data (a policy loss's own metrics, one accuracy per data source); ``keys`` names the ones
        always there.
    :ivar honours: ``{action: what it does here}``, the verdict actions this stage carries out (``proceed``
        everywhere, so it is not listed). A guard whose ``actions`` declare another is refused when it is built,
        and a verdict with another is an error (``stability.guard``), never logged as if it had been done.
    :ivar typical: ordinary values of its keys, what ``armor_core.testing.check_guard`` feeds a guard before
        the odd values.
    """

    where: str
    keys: tuple[str, ...]
    optional: Mapping[str, str]
    families: Mapping[str, str]
    honours: Mapping[str, str]
    typical: Mapping[str, float]

    def declares(self, key: str) -> bool:
        """Whether ``key`` is one of this stage's statistics (always, sometimes, or a member of a family)."""
        return key in self.keys or key in self.optional or key.startswith(tuple(self.families))

    def honoured(self, action: str) -> bool:
        return action == "proceed" or action in self.honours


#: every guard stage, in the order of a step: the one table the contract text, ``armor new guard``, ``check_guard``
#: and the guard runner's refusals read (``tests/core/loop/test_guard_stage_keys.py`` holds it to the code)
GUARD_STAGES: dict[str, GuardStage] = {
    "reward": GuardStage(
        "driver, after scoring, before the log-probs",
        ("score/mean", "score/min", "score/max"),
        {},
        {},
        _BEFORE_UPDATE,
        {"score/mean": 0.5, "score/min": 0.0, "score/max": 1.0},
    ),
    "advantage": GuardStage(
        "driver, after the estimator, the last look before the update",
        (
            "score/mean",
            "score/min",
            "score/max",
            "response_length/mean",
            "response_length/max",
            "response_length/min",
            "response_length/clip_ratio",
            "critic/advantages/mean",
            "critic/advantages/max",
            "critic/advantages/min",
        ),
        _ROLLOUT_BEFORE_UPDATE,
        {},
        _BEFORE_UPDATE,
        {
            "score/mean": 0.5,
            "score/min": 0.0,
            "score/max": 1.0,
            "response_length/mean": 200.0,
            "response_length/max": 512.0,
            "response_length/min": 20.0,
            "response_length/clip_ratio": 0.05,
            "rollout/entropy": 0.6,
            "critic/advantages/mean": 0.0,
            "critic/advantages/max": 1.5,
            "critic/advantages/min": -1.5,
        },
    ),
    "grad": GuardStage(
        "each actor rank, after backward, before the optimizer step, per mini-batch",
        ("grad_norm", "pg_loss"),
        {
            "rollout/logprob_diff_mean": "the update's first mini-batch, when its rows carry the backend's log-probs",
            "rollout/logprob_diff_max": "as rollout/logprob_diff_mean",
        },
        {},
        {
            "skip": "this optimizer step is not taken (its gradients are dropped)",
            "scale": "the gradients are multiplied by ``scale`` before the optimizer step",
            "adjust": "applied at once on every rank, to this optimizer step",
            "rollback": "as ``skip``: a worker cannot restore a checkpoint (a guard that wants one restored says "
            "``rollback`` at a driver stage, e.g. ``update``)",
        },
        {"grad_norm": 1.0, "pg_loss": 0.1},
    ),
    "step": GuardStage(
        "each actor rank, after the optimizer step; only for guards that list it in ``stages``",
        ("update_ratio", "update_norm", "param_norm", "lr"),
        {
            "policy_kl": "a guard lists it in its ``needs``; it costs a forward of a few rows",
            "teacher_kl": "with ``policy_kl`` in a distillation run (``algorithm.distill``): KL(policy before the "
            "step || teacher) on the same probe tokens, nats per token",
        },
        {},
        {
            "skip": "the parameters are put back as they were before this optimizer step (Adam's moments keep "
            "the gradient)",
            "adjust": "applied at once on every rank, from the next optimizer step on",
            "rollback": "as ``skip``: a worker cannot restore a checkpoint",
        },
        {
            "update_ratio": 1e-3,
            "update_norm": 0.01,
            "param_norm": 10.0,
            "lr": 1e-5,
            "policy_kl": 1e-3,
            "teacher_kl": 0.5,
        },
    ),
    "update": GuardStage(
        "driver, after the update; not shown when a verdict before it skipped the update",
        ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "actor/skipped_updates"),
        _ROLLOUT_AFTER_UPDATE,
        {
            "actor/": "the update's metrics, means over its mini-batches: the policy loss's own (ppo_clip: "
            "actor/pg_clipfrac, actor/ppo_kl, actor/ratio_max and others), actor/kl_loss with actor.use_kl_loss, "
            "actor/reward_kl with algorithm.use_kl_in_reward, actor/update_ratio and actor/policy_kl with stage "
            "``step``",
            "moe/": "an MoE model's routing in the update's forward (armor_core/models/moe.py): moe/load_max, "
            "moe/load_min, moe/load_entropy, moe/experts_unused",
        },
        _AFTER_UPDATE,
        {
            "actor/pg_loss": 0.1,
            "actor/entropy": 1.2,
            "actor/grad_norm": 1.0,
            "actor/lr": 1e-5,
            "actor/skipped_updates": 0.0,
            "actor/pg_clipfrac": 0.02,
            "actor/ppo_kl": 1e-3,
            "actor/kl_loss": 0.0,
        },
    ),
    "validation": GuardStage(
        "driver, after a validation: before the first step (``trainer.val_before_train``) and every "
        "``trainer.val_freq`` steps",
        ("val/acc_greedy", "val/step"),
        {},
        {"val/": "per data source and sampling mode: val/<data_source>/acc_greedy, val/mean@<n> and others"},
        _AFTER_UPDATE,
        {"val/acc_greedy": 0.5, "val/step": 10.0},
    ),
}


@dataclass(frozen=True)
class Verdict:
    """A guard's decision about one stage of one step.

    :param action: ``proceed``; ``skip`` the update; ``scale`` the gradients by ``scale``;
        ``adjust`` coefficients (``adjustments`` maps names in ``ADJUSTABLE_COEFFICIENTS`` to new
        absolute values, kept by the guard within its configured bounds); ``rollback`` to the last
        good state: a rollback point the run keeps for itself every ``guard.rollback_every`` steps
        while a guard may roll back, or a checkpoint. What each does at each stage, and which a stage
        cannot carry out at all, is ``GUARD_STAGES[stage].honours``.
    :param adjustments: may ride on any action but ``proceed`` (a skip that also lowers the
        learning rate); they are applied whatever else happens, after a rollback's restore, which
        keeps the learning rate in force and the guards' state.
    :param since: for ``rollback``, the first step whose weights the guard suspects (the update
        that made them); the trainer restores the newest rollback point or checkpoint saved *before*
        that step, so one kept after the damage but before it was noticed is never the one restored.
        None: the newest.
    """

    action: VerdictAction = "proceed"
    reason: str = ""
    signal: float | None = None
    threshold: float | None = None
    scale: float = 1.0
    adjustments: dict[str, float] = field(default_factory=dict)
    since: int | None = None

    @classmethod
    def proceed(cls) -> Verdict:
        return cls()


@runtime_checkable
class StabilityGuard(Protocol):
    """Built as ``guard_cls(**params)`` from ``guard.guards[i].params``.

    ``observe`` is called for each stage of ``GUARD_STAGES`` with that stage's scalar statistics
    (the table says where each stage runs, the keys it always carries, those it carries only in
    some runs, and the families whose names depend on the plugins); it must be cheap and
    deterministic, because every data-parallel rank must reach the same verdict from the same
    (reduced) statistics. One instance lives in the driver and one in each actor rank, each built
    from the same params; ``state_dict`` must return plain JSON (it is saved in checkpoints and in
    each worker's ``guard_worker.json``).

    Before the update the driver shows ``reward`` (the scores) and ``advantage`` (the scores again,
    the responses' lengths, the entropy of the sampler estimated from its log-probs, the
    advantages): a guard that watches the rollout acts on the update these rows are about to make,
    not one step late. After it, ``update`` carries the update's ``actor/*`` metrics.

    Stage ``step`` comes right after ``optimizer.step`` in each actor worker, with
    ``update_ratio`` (``||new - old|| / ||old||`` over all parameters), ``update_norm`` and
    ``param_norm``; ``skip`` there puts the old parameters back. It costs a copy of the
    parameters per update, so it runs only when some guard lists it in a class attribute
    ``stages`` (a guard without ``stages`` sees every other stage).

    What a verdict does depends on the stage, and some actions a stage cannot carry out (a
    ``skip`` at ``update``, where the update is already made): ``GUARD_STAGES[stage].honours``.
    A guard may declare the actions it can return in a class attribute ``actions``, ``{stage:
    (action, ...)}`` (a stage it sees but does not list: only ``proceed``); a guard that declares
    one its stage cannot honour is refused when it is built (``ConfigError`` naming
    ``guard.guards[i]``), and a verdict a stage cannot honour (or one the guard did not declare)
    stops the run with a ``GuardVerdictError`` rather than being logged as done.
    ``armor_core.testing.check_guard`` checks both. Coefficients that can be adjusted:
    ``ADJUSTABLE_COEFFICIENTS``.

    Optional statistics (``OPTIONAL_STATS``, e.g. ``policy_kl``: how far one optimizer step moved the
    policy, in nats per token) cost more work and are measured only for a guard that lists them in a
    class attribute ``needs`` (a name there that no stage measures, or of a stage the guard does not
    list in ``stages``, is a ConfigError at start). A guard that may skip some steps defines
    ``needs_at(step) -> bool``: the worker then runs stage ``step`` (copy, measurement, verdict) only
    at steps some guard wants, and at every step taken at a rate over 1.25x the last judged one's;
    like ``observe`` it must depend only on the guard's state, which is the same on every rank.
    """

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class RolloutBackend(Protocol):
    """Built as ``backend_cls(model, tokenizer, config)`` inside a worker process.

    ``generate`` takes a DataProto with left-padded ``input_ids``, ``attention_mask`` and
    ``position_ids`` (bs, prompt_length) and returns one with ``responses``, ``response_mask``
    (bs, response_length, right-padded) and ``rollout_log_probs`` (bs, response_length), the
    sampler's own log-probabilities of the sampled tokens: those of the distribution it drew from,
    renormalised over the kept set when ``top_p`` / ``top_k`` truncate. A truncated draw also returns
    ``rollout_kept_mass`` (bs, response_length) and, with ``rollout.sampling_replay``, the kept sets
    ``rollout_kept_ids`` (bs, response_length, K) int32, -1 padded (``armor_core.ops.sampling_replay``).
    ``update_weights`` receives ``(name, tensor)`` pairs of the new policy.

    ``generate(prompts, greedy=False, **sampling_overrides)``: ``greedy=True`` is argmax decoding
    (validation), with log-probs at temperature 1; overrides are ``temperature``, ``top_p``,
    ``top_k``, ``max_new_tokens``, ``n``. An optional classmethod ``check_available()`` raises
    ``ImportError`` (saying how to install what is missing) and is called before any worker starts.

    Class attributes saying how weights reach the backend: ``shares_module = True`` for a backend
    that generates by running the very module it is given (it also exposes it as ``.model``, which
    tells the actor there is nothing to send); ``separate_worker = True`` for one that can run in a
    rollout worker of its own (``rollout.mode=async``). A backend without ``shares_module`` holds
    weights of its own: with LoRA
    (``model.lora_rank > 0``) it is given a view of the base model whose ``state_dict`` has the
    base model's names with the adapters merged in, and ``update_weights`` then receives only the
    adapted layers' merged weights (nothing else changes). A backend that follows a LoRA policy
    itself sets ``serves_lora = True``: it is given the ``PeftModel`` and, after each update,
    ``update_lora(peft_model)`` is called instead of ``update_weights``. ``eos_token_ids``: the ids that end an
    assistant turn in a multi-turn episode (default: the tokenizer's ``eos_token_id``). ``weight_sums(names)``:
    sums of the weights the engine holds, so every sync is checked (``armor_core.models.weight_sums``). All of
    them: ``CAPABILITIES["rollout_backend"]``.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: Any) -> None: ...

    def generate(self, prompts: DataProto, *, greedy: bool = False, **sampling_overrides: Any) -> DataProto: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


@runtime_checkable
class MetricTracker(Protocol):
    """Built as ``tracker_cls(run_dir, config)``; ``log`` gets a flat ``{name: float}`` dict.

    Optional: ``resume(step: int) -> None``, called once when a run resumes from the checkpoint of
    ``step``, before anything is logged; the steps after it are logged again, so a tracker that
    keeps earlier runs' rows should drop (or hide) those past ``step``. ``summary(summary: dict)
    -> None``, called once at the end of a run that finished, before ``close``, with what the
    trainer writes to ``summary.json``. ``close`` runs in a ``finally`` block, also when the run
    failed. A classmethod ``check_available()`` raising ``ImportError`` (saying what to install)
    is called when the config is checked, before anything starts.
    """

    def __init__(self, run_dir: str | Path, config: Any) -> None: ...

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


#: kind name -> (hook name, wrapper for plain callables or None for class-like kinds)
#: what an environment answers with: text (sent as a user message), chat messages (``{"role": "tool",
#: "content": ...}``), or None for nothing
Observation = str | Sequence[Mapping[str, str]] | None


@dataclass(frozen=True)
class AssistantTurn:
    """One assistant turn of an episode as the policy sampled it: ``text`` decoded from ``token_ids``,
    ``index`` 0 for the first turn, ``finished`` False when the episode's token budget cut it."""

    text: str
    token_ids: tuple[int, ...]
    index: int
    finished: bool = True


@dataclass(frozen=True)
class EnvironmentStep:
    """An environment's answer to one assistant turn: the next ``observation``, whether the episode is
    ``done``, ``reward_parts`` added to the episode's reward components (``{name: score}``, summed over
    turns), and ``metrics`` (numbers summed over the episode, logged as ``env/<name>``)."""

    observation: Observation = None
    done: bool = False
    reward_parts: Mapping[str, float] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


class Environment(Protocol):
    """Built once per episode as ``env_cls(row, seed=seed, **params)`` in the rollout worker's process:
    ``row`` is the dataset row (its ``extra`` holds per-row arguments, e.g. a tool's hidden table),
    ``seed`` is the same for the ``n`` episodes of one row and step, ``params`` come from
    ``rollout.multi_turn.environment_kwargs``.

    ``reset()`` returns an observation appended after the prompt before the first turn (usually
    None: the prompt is the first observation). ``step(turn)`` gets each assistant turn and returns an
    ``EnvironmentStep``. Either may be ``async def``: the episodes of a batch step concurrently, so a
    slow tool does not serialise them (a plain ``def`` runs in a thread). Observation tokens are
    appended to the sampled ids, never re-tokenising them, and are masked out of every loss.

    Optional (``CAPABILITIES["environment"]``): a static ``prompt_kwargs(**params) -> dict``, keyword arguments
    for the chat template of every prompt (the ``tools`` environment's function schemas);
    ``close()``, called when the episode ends, also when it failed; and a static
    ``check_params(**params)``, called once in the driver before any worker starts with the ``params``
    every episode will get, raising ``ValueError`` or ``TypeError`` naming a bad one (``armor run`` and
    ``--dry-run`` print it as one line). A key of ``environment_kwargs`` the constructor does not take is
    refused then too.

    What an environment raises (``SystemExit`` included) or withholds ends its own episode, counted as
    ``env_error`` or ``env_timeout``; a ``step`` returning ``reward_parts`` or ``metrics`` that are not
    finite numbers under str names does too, none of that step kept. The reward domains see why an episode
    ended, the error and the summed ``metrics`` in ``extra[EPISODE_KEY]`` (a domain may fail such a row).
    A plain ``def`` runs on a daemon thread of its own, abandoned past ``rollout.multi_turn.step_timeout_s``;
    an ``async def`` runs on the rollout's event loop and must not block it.
    """

    def __init__(self, row: Mapping[str, Any], *, seed: int) -> None: ...

    def reset(self) -> Observation | Awaitable[Observation]: ...

    def step(self, turn: AssistantTurn) -> EnvironmentStep | Awaitable[EnvironmentStep]: ...


#: the key of a reward row's ``extra`` under which a domain whose ``fn`` sets ``wants_data_source`` gets the row's
#: ``data_source`` (``CAPABILITIES["reward_domain"]``)
DATA_SOURCE_KEY = "_armor_data_source"
#: the key of a reward row's ``extra`` under which every domain gets, for a multi-turn episode, how it went:
#: ``{"end": why it ended (``done``, ``max_turns``, ``max_response_tokens``, ``env_error``, ``env_timeout``),
#: "error": the environment's failure as text or None, "metrics": the environment's metrics summed over the episode}``
EPISODE_KEY = "_armor_episode"


class Capability(NamedTuple):
    """An optional attribute or method of a plugin: the core reads it with :func:`capability`, and a plugin that
    leaves it out behaves as if it had set ``default``."""

    default: Any
    doc: str


_CHECK_AVAILABLE = Capability(
    None,
    "classmethod ``check_available() -> None`` raising ``ImportError`` (saying what to install) for a library that "
    "is an optional install; called when the config is checked, before any worker starts",
)

#: Every optional attribute or method the core reads from a plugin, per kind: what it means and what a plugin
#: without it gets. The core reads them only through :func:`capability`, so this table is the complete list.
CAPABILITIES: dict[str, dict[str, Capability]] = {
    # the function-like kinds' options are the fields of their dataclasses (``AdvantageEstimator.grouped``, ...)
    "advantage_estimator": {},
    "policy_loss": {},
    "kl_estimator": {},
    "loss_aggregation": {},
    "task": {},
    "reward_domain": {
        "wants_data_source": Capability(
            False,
            "an attribute of the domain's ``fn`` (a function attribute, or a class attribute of a callable object): "
            "True hands ``fn`` each row's ``data_source`` in ``extra[DATA_SOURCE_KEY]``, for a function that "
            "serves several data sources (``reward.custom`` files, ``reward.remote`` services)",
        ),
    },
    "stability_guard": {
        "stages": Capability(None, "the stages the guard is shown; None: every stage but the opt-in ``step``"),
        "actions": Capability(
            None,
            "``{stage: (action, ...)}``, what the guard may return where, checked at start; None: anything "
            "(checked when returned)",
        ),
        "needs": Capability((), "the optional statistics (``OPTIONAL_STATS``) the guard reads, measured only then"),
        "needs_at": Capability(
            None, "``needs_at(step) -> bool``: whether the guard wants its costly stages at ``step``; None: always"
        ),
        "adjusted": Capability(
            None,
            "``adjusted(adjustments)``: told, in each actor worker, of coefficients a verdict of a driver stage "
            "changed (another guard's, or a rollback's), for a guard that keeps its own view of one; None: not told",
        ),
        "check_available": _CHECK_AVAILABLE,
    },
    "rollout_backend": {
        "shares_module": Capability(
            False, "True: generates by running the very module it is given (exposed as ``.model``), nothing to send"
        ),
        "separate_worker": Capability(False, "True: can run in a rollout worker of its own (``rollout.mode=async``)"),
        "serves_lora": Capability(
            False, "True: given the ``PeftModel``, it follows the adapters itself (``update_lora(peft_model)``)"
        ),
        "eos_token_ids": Capability(
            None, "the token ids that end a turn in a multi-turn episode; None: the tokenizer's ``eos_token_id``"
        ),
        "weight_sums": Capability(
            None,
            "``weight_sums(names) -> {key: HeldSum}``: sums of what the engine holds for the trainer's tensor "
            "``names`` after a sync, which ``rollout.verify_sync`` compares with what was sent "
            "(``models/weight_sums.py``); None (also on an instance): its syncs are not checked, a warning says so",
        ),
        "check_available": _CHECK_AVAILABLE,
    },
    "metric_tracker": {
        "resume": Capability(None, "``resume(step)``, called once after ``--resume`` (see ``MetricTracker``)"),
        "summary": Capability(None, "``summary(summary)``, called once at the end with ``summary.json``'s contents"),
        "check_available": _CHECK_AVAILABLE,
    },
    "environment": {
        "check_params": Capability(
            None, "static ``check_params(**params)`` run in the driver at start, raising on a bad parameter"
        ),
        "prompt_kwargs": Capability(
            None,
            "static ``prompt_kwargs(**params) -> dict``: keyword arguments for the chat template of every prompt "
            "(the ``tools`` environment's function schemas); the user's ``data.apply_chat_template_kwargs`` win",
        ),
        "close": Capability(None, "``close()`` on an episode's instance, called when the episode ends, also failed"),
        "check_available": _CHECK_AVAILABLE,
    },
}


def capability(kind: str, plugin: object, name: str) -> Any:
    """``plugin``'s optional ``name`` (an attribute, or a method: then the bound method), else its documented default.

    ``plugin`` is the registered object (a class for class-like kinds, or an instance of it), or for
    ``reward_domain`` the domain's ``fn``. ``name`` must be declared in ``CAPABILITIES[kind]`` (a KeyError
    otherwise), so an optional attribute the core reads is never undocumented.
    """
    return getattr(plugin, name, CAPABILITIES[kind][name].default)


KINDS: dict[str, tuple[str, type | None]] = {
    "advantage_estimator": ("armor_register_advantage_estimators", AdvantageEstimator),
    "policy_loss": ("armor_register_policy_losses", PolicyLoss),
    "kl_estimator": ("armor_register_kl_estimators", KLEstimator),
    "loss_aggregation": ("armor_register_loss_aggregations", LossAggregation),
    "reward_domain": ("armor_register_reward_domains", RewardDomain),
    "stability_guard": ("armor_register_stability_guards", None),
    "rollout_backend": ("armor_register_rollout_backends", None),
    "task": ("armor_register_tasks", Task),
    "metric_tracker": ("armor_register_metric_trackers", None),
    "environment": ("armor_register_environments", None),
}


def unknown_param(fn: Callable[..., Any], extra: Mapping[str, Any], n_positional: int, where: str) -> str | None:
    """Why one of the user-supplied ``extra`` keywords cannot be passed to ``fn``, or None when all can.

    ``n_positional`` arguments are passed by position and are not keywords a user may set. The message names
    ``where`` (``algorithm.adv_kwargs``), the nearest accepted name and every accepted one. Called at start by
    ``config.plugin_checks.validate_plugins`` and again by ``call_with_params``, so a run never reaches step 1
    with a misspelt key.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    accepted = [
        k
        for k, p in list(params.items())[n_positional:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for key in extra:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            name = getattr(fn, "__name__", repr(fn))
            return f"{where}: unknown parameter {key!r} for {name}.{hint} It accepts: {', '.join(accepted) or 'none'}"
    return None


def call_with_params(
    fn: Callable[..., _R],
    /,
    *args: Any,
    available: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    where: str = "",
) -> _R:
    """Call ``fn(*args, **kw)`` passing only the keyword parameters ``fn`` declares.

    ``available`` are values the core offers (``gamma``, ``values``, ...), passed when declared.
    ``extra`` are user-supplied parameters (``algorithm.adv_kwargs``): every one of them must be
    declared by ``fn`` (``unknown_param``); the config check makes the same test before anything starts.
    """
    params = inspect.signature(fn).parameters
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in available.items() if k in params or takes_var_kw}
    problem = unknown_param(fn, extra or {}, len(args), where or fn.__name__)
    if problem:
        raise TypeError(problem)
    kwargs.update(extra or {})
    return fn(*args, **kwargs)
