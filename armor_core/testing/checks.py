"""Contract checks, one per plugin kind (``CHECKS``): each runs an implementation on awkward input
and asserts what the trainer relies on, so a plugin author's test is one call."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence, get_args

import torch

from armor_core.interfaces import (
    ADJUSTABLE_COEFFICIENTS,
    GUARD_STAGES,
    AdvantageEstimator,
    KLEstimator,
    LossAggregation,
    MetricTracker,
    PolicyLoss,
    RewardDomain,
    RewardResult,
    RolloutBackend,
    StabilityGuard,
    Task,
    Verdict,
    VerdictAction,
    call_with_params,
    capability,
    ground_truth_check_problem,
    unknown_param,
)
from armor_core.testing.environments import check_environment

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PreTrainedTokenizerBase

    from armor_core.dataproto.protocol import DataProto


def _toy_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bs, t = 8, 5
    mask = torch.ones(bs, t)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    mask[7] = 0  # a fully masked row
    rewards = torch.zeros(bs, t)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.0])  # groups: {0,1} {2,3} {4,5,6} {7}
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    rewards[last] = scores[last.any(-1)]
    index = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    values = torch.randn(bs, t, generator=g) * mask
    baseline = torch.tensor([0.5, 0.5, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # a greedy response's score, per group
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": index,
        "values": values,
        "baseline_scores": baseline,
    }


def check_advantage_estimator(estimator: AdvantageEstimator, **params: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``estimator`` on a small batch with awkward rows and check the trainer's contract.

    Checks: both outputs have the input's shape, are finite, and are zero outside the response
    mask (including a fully masked row). Returns ``(advantages, returns)`` for further asserts.
    """
    b = _toy_batch()
    available = {
        "values": b["values"],
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std": True,
        "reward_components": None,
        "baseline_scores": b["baseline_scores"],
    }  # what the trainer offers
    adv, ret = call_with_params(
        estimator.fn, b["token_level_rewards"], b["response_mask"], b["index"], available=available, extra=params
    )
    for name, out in (("advantages", adv), ("returns", ret)):
        assert out.shape == b["response_mask"].shape, (
            f"{name} has shape {tuple(out.shape)}, expected {tuple(b['response_mask'].shape)}"
        )
        assert torch.isfinite(out).all(), f"{name} has non-finite values: {out}"
        assert (out[b["response_mask"] == 0] == 0).all(), f"{name} is non-zero outside the response mask: {out}"
    return adv, ret


def check_policy_loss(loss: PolicyLoss, **params: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run ``loss`` on extreme log-ratios and check shape, finiteness, masking and a finite gradient."""
    b = _toy_batch()
    mask = b["response_mask"]
    log_prob = (torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * 50).requires_grad_(True)
    old_log_prob = torch.full(mask.shape, -1000.0)
    adv = torch.linspace(-3, 3, mask.numel()).reshape(mask.shape) * mask
    available = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    loss_mat, metrics = call_with_params(loss.fn, log_prob, old_log_prob, adv, mask, available=available, extra=params)
    assert loss_mat.shape == mask.shape, f"loss_mat has shape {tuple(loss_mat.shape)}, expected {tuple(mask.shape)}"
    assert torch.isfinite(loss_mat).all(), f"loss is not finite for log-ratios near 1000: {loss_mat}"
    assert (loss_mat[mask == 0] == 0).all(), "loss is non-zero outside the response mask"
    loss_mat.sum().backward()
    assert log_prob.grad is not None and torch.isfinite(log_prob.grad).all(), "gradient is missing or not finite"
    assert isinstance(metrics, dict)
    return loss_mat, metrics


def check_reward_domain(
    domain: RewardDomain,
    cases: list[tuple[str, str, Any, float]],
    extra: dict | None = None,
    *,
    refused: Sequence[Any] = (),
    **params: Any,
) -> None:
    """Score ``(prompt, response, ground_truth, expected_score)`` cases as training does and compare (to 1e-6).

    ``params`` are the domain's keyword parameters, as ``reward.domain_kwargs.<name>`` passes them (a key
    ``fn`` does not take fails, as the config check would). Checks: the domain's ``validate_ground_truth``,
    if it has one, can be called as ``(ground_truth, extra)`` and accepts every case's ground truth (a row
    it refuses never reaches ``fn`` in training) and refuses, with ``ValueError``, each ground truth in
    ``refused``; ``fn`` returns a number or a ``RewardResult``, not text; the score is the expected one.
    """
    name = getattr(domain.fn, "__name__", repr(domain.fn))
    problem = unknown_param(domain.fn, params, 4, "reward.domain_kwargs")
    assert problem is None, problem
    check = domain.validate_ground_truth
    problem = ground_truth_check_problem(check)
    assert problem is None, f"{name}: {problem}"
    for gt in refused:
        try:
            check(gt, extra or {})  # type: ignore[misc]
        except ValueError:
            continue
        raise AssertionError(
            f"{name}: validate_ground_truth accepted the ground truth {gt!r}, listed in refused"
            if check is not None
            else f"{name} has no validate_ground_truth, so nothing refuses the ground truths listed in refused"
        )
    for prompt, response, gt, expected in cases:
        if check is not None:
            try:
                check(gt, extra or {})
            except ValueError as e:
                raise AssertionError(
                    f"{name}: validate_ground_truth refuses the ground truth {gt!r} ({e}); training would refuse "
                    "such a row when the data loads, so it is no case to score"
                ) from None
        out = domain(prompt, response, gt, extra or {}, **params)
        assert isinstance(out, RewardResult)
        assert not isinstance(out.score, (str, bytes)), (
            f"{name}({prompt!r}, {response!r}, {gt!r}) returned the text {out.score!r}; return a number "
            "(training fails such a row)"
        )
        assert abs(out.score - expected) < 1e-6, (
            f"{name}({prompt!r}, {response!r}, {gt!r}) = {out.score}, expected {expected}"
        )


#: ordinary statistics of each guard stage, for :func:`check_guard` (from ``interfaces.GUARD_STAGES``)
GUARD_STATS: dict[str, dict[str, float]] = {stage: dict(s.typical) for stage, s in GUARD_STAGES.items()}


def _guard_rounds(
    stages: list[str], steps: int, stats: Mapping[str, Mapping[str, float]]
) -> Iterator[tuple[str, dict[str, float], int]]:
    """(stage, stats, step): ``steps`` steps of drifting ordinary statistics, then one of NaN and inf
    values and one with every statistic missing."""
    for step in range(1, steps + 1):
        for stage in stages:
            yield (
                stage,
                {k: v * (1 + 0.05 * step) for k, v in {**GUARD_STATS[stage], **stats.get(stage, {})}.items()},
                step,
            )
    for step, odd in ((steps + 1, math.nan), (steps + 2, math.inf)):
        for stage in stages:
            yield stage, dict.fromkeys(GUARD_STATS[stage], odd), step
    for stage in stages:
        yield stage, {}, steps + 3


def check_guard(
    guard_cls: type[StabilityGuard],
    stats: Mapping[str, Mapping[str, float]] | None = None,
    steps: int = 20,
    **params: Any,
) -> list[tuple[str, int, Verdict]]:
    """Build ``guard_cls(**params)`` and check the contract the trainer relies on.

    Each stage the guard sees (its ``stages``, else every stage but the opt-in ``step``) is shown
    ``steps`` steps of ordinary statistics (``GUARD_STATS``, updated with ``stats[stage]``), then
    NaN, inf and missing ones. Checks: the guard's ``actions``, if it declares them, name stages it
    sees and actions they honour; ``observe`` returns a :class:`~armor_core.interfaces.Verdict` with
    a known action that its stage honours (``GUARD_STAGES[stage].honours``) and the guard declared,
    a finite non-negative ``scale`` and only ``ADJUSTABLE_COEFFICIENTS`` in ``adjustments``; a
    second instance reaches the same verdicts (every rank must); ``state_dict`` is plain JSON, and
    an instance loaded from it mid-way continues with the same verdicts.
    Returns ``[(stage, step, verdict)]`` for further asserts.
    """
    from armor_core.stability.guard import declaration_problem, sees, verdict_problem

    guard, twin = guard_cls(**params), guard_cls(**params)
    problem = declaration_problem(guard)
    assert problem is None, problem
    stages = [s for s in GUARD_STAGES if sees(guard, s)]
    declared = capability("stability_guard", guard, "stages")
    assert stages, f"{guard_cls.__name__}.stages = {declared!r} names no stage of {list(GUARD_STAGES)}"
    rounds = list(_guard_rounds(stages, steps, stats or {}))
    verdicts, restored = [], None
    for i, (stage, stat, step) in enumerate(rounds):
        if i == len(rounds) // 2:  # a resumed run: a fresh instance loads the state from its JSON
            state = guard.state_dict()
            restored = guard_cls(**params)
            restored.load_state_dict(json.loads(json.dumps(state)))
        v = guard.observe(stage, stat, step)
        where = f"{guard_cls.__name__}.observe({stage!r}, {stat}, {step})"
        assert isinstance(v, Verdict), f"{where} returned {v!r}, not a Verdict"
        assert v.action in get_args(VerdictAction), f"{where}: unknown action {v.action!r}"
        problem = verdict_problem(guard_cls.__name__, guard, stage, v)
        assert problem is None, f"{where}: {problem}"
        assert math.isfinite(v.scale) and v.scale >= 0, f"{where}: scale {v.scale} must be finite and >= 0"
        assert set(v.adjustments) <= set(ADJUSTABLE_COEFFICIENTS), (
            f"{where}: adjusts {sorted(v.adjustments)}; only {ADJUSTABLE_COEFFICIENTS} can be"
        )
        # compared by repr: a NaN signal is equal to itself there
        assert repr(twin.observe(stage, stat, step)) == repr(v), (
            f"{where}: a second instance built from the same params decided otherwise"
        )
        if restored is not None:
            assert repr(restored.observe(stage, stat, step)) == repr(v), (
                f"{where}: an instance restored from state_dict() decided otherwise"
            )
        verdicts.append((stage, step, v))
    return verdicts


def check_kl_estimator(estimator: KLEstimator) -> torch.Tensor:
    """Run a ``KLEstimator`` on log-ratios up to +-30 and on equal log-probs. Checks: the input's
    shape, finite values and a finite gradient (the trainer bounds nothing after it), and 0 where
    the two policies agree. Returns the per-token KL of the extreme case."""
    g = torch.Generator().manual_seed(0)
    ref = -torch.rand(4, 6, generator=g) * 5
    log_prob = (ref + torch.linspace(-30, 30, 24).reshape(4, 6)).requires_grad_(True)
    kl = estimator.fn(log_prob, ref)
    assert kl.shape == ref.shape, f"KL has shape {tuple(kl.shape)}, expected {tuple(ref.shape)}"
    assert torch.isfinite(kl).all(), f"KL is not finite for log-ratios in [-30, 30]: {kl}"
    kl.sum().backward()
    assert log_prob.grad is not None and torch.isfinite(log_prob.grad).all(), (
        "the KL's gradient is missing or not finite"
    )
    same = estimator.fn(ref.clone(), ref)
    assert torch.allclose(same, torch.zeros_like(same), atol=1e-6), (
        f"KL between a policy and itself should be 0, got {same}"
    )
    return kl.detach()


def check_loss_aggregation(aggregation: LossAggregation) -> torch.Tensor:
    """Aggregate a per-token loss with a fully masked row. Checks: a finite scalar, 0 for a zero
    loss, linear in the loss (the trainer sums micro-batch shares), and no gradient reaching the
    positions outside the mask. Returns the aggregated toy loss."""
    b = _toy_batch()
    mask = b["response_mask"]
    loss_mat = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    counts = {
        "global_num_tokens": float(mask.sum()),
        "global_num_seqs": float((mask.sum(-1) > 0).sum()),
        "norm_constant": 8.0,
    }
    loss = aggregation.fn(loss_mat, mask, **counts)
    assert loss.dim() == 0 and torch.isfinite(loss), f"the aggregated loss must be a finite scalar, got {loss}"
    zero = aggregation.fn(torch.zeros_like(loss_mat), mask, **counts)
    assert float(zero) == 0.0, f"a zero loss aggregates to {float(zero)}, not 0"
    doubled = aggregation.fn(2 * loss_mat.detach(), mask, **counts)
    assert torch.allclose(doubled, 2 * loss.detach(), rtol=1e-5), "aggregation is not linear in the loss"
    loss.backward()
    assert loss_mat.grad is not None, "the aggregated loss does not reach loss_mat"
    assert (loss_mat.grad[mask == 0] == 0).all(), "gradient reaches positions outside the response mask"
    return loss.detach()


def _posed(rows: list[dict[str, Any]]) -> set[str]:
    """What each row asks: its prompt, with the state it hides from the policy when it has some (the tool
    arguments of ``extra_info.tools_kwargs``, or a game's ``extra_info.game_seed``)."""
    out = set()
    for r in rows:
        extra = r.get("extra_info") or r.get("extra") or {}
        hidden = extra.get("tools_kwargs", extra.get("game_seed"))
        out.add(json.dumps(r["prompt"] if hidden is None else [r["prompt"], hidden], sort_keys=True))
    return out


def check_task(task: Task, size: int = 16, **params: Any) -> list[dict[str, Any]]:
    """Ask a ``Task`` for ``size`` train and test rows. Checks: ``size`` rows, each with a prompt (a
    string or a list of chat messages), a string ``data_source`` and a ``ground_truth`` key; the same
    seed gives the same rows; train and test pose no common problem: no prompt, or for a row whose tools
    read state it hides from the policy (``extra_info.tools_kwargs``, a multi-turn task's table; a game's
    ``extra_info.game_seed``), no prompt with the same hidden state, since such a row's answer depends on both.
    Returns the train rows."""
    train = task.fn("train", size, 0, **params)
    assert isinstance(train, list) and len(train) == size, (
        f"asked for {size} rows, got {len(train) if isinstance(train, list) else type(train).__name__}"
    )
    for i, row in enumerate(train):
        assert isinstance(row, dict) and {"prompt", "data_source", "ground_truth"} <= set(row), (
            f"row {i} lacks prompt/data_source/ground_truth: {row!r}"
        )
        assert isinstance(row["prompt"], (str, list)) and row["prompt"], (
            f"row {i}: the prompt must be a non-empty string or message list"
        )
        assert isinstance(row["data_source"], str) and row["data_source"], (
            f"row {i}: data_source must be a non-empty string"
        )
    assert task.fn("train", size, 0, **params) == train, "the same seed gave different rows"
    overlap = _posed(train) & _posed(task.fn("test", size, 0, **params))
    assert not overlap, f"train and test share prompts: {sorted(overlap)[:3]}"
    return train


def check_rollout_backend(
    backend_cls: type[RolloutBackend],
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str] | None = None,
    **rollout: Any,
) -> DataProto:
    """Build ``backend_cls(model, tokenizer, RolloutConfig(**rollout))`` and generate for a few
    prompts. Checks: ``responses``, ``response_mask`` and ``rollout_log_probs`` of one shape, the
    mask 0/1 and right-padded, log-probs finite and <= 0 on the response, 0 after it; greedy
    decoding is deterministic. Returns the sampled DataProto."""
    from armor_core.config.schema import RolloutConfig
    from armor_core.dataproto.protocol import DataProto
    from armor_core.models.loading import encode_prompts

    ids, mask, pos, _ = encode_prompts(tokenizer, prompts or ["1+2=", "12+34=", "5="], max_length=32)
    batch = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    backend = backend_cls(model, tokenizer, RolloutConfig(**{"max_new_tokens": 6, **rollout}))
    out = backend.generate(batch)
    resp, rmask, lp = out["responses"], out["response_mask"], out["rollout_log_probs"]
    assert resp.shape == rmask.shape == lp.shape and resp.shape[0] == len(batch), (
        f"shapes differ: {resp.shape}, {rmask.shape}, {lp.shape}"
    )
    assert set(rmask.unique().tolist()) <= {0, 1}, "response_mask must be 0/1"
    assert (rmask[:, 1:] <= rmask[:, :-1]).all(), "response_mask must be right-padded (no 1 after a 0)"
    valid = rmask.bool()
    assert torch.isfinite(lp[valid]).all() and (lp[valid] <= 1e-5).all(), (
        "rollout_log_probs must be finite log-probabilities on the response"
    )
    assert (lp[~valid] == 0).all(), "rollout_log_probs must be 0 after the response"
    first, second = backend.generate(batch, greedy=True), backend.generate(batch, greedy=True)
    assert torch.equal(first["responses"], second["responses"]), (
        "greedy decoding gave different responses for the same prompts"
    )
    return out


def check_metric_tracker(tracker_cls: type[MetricTracker], run_dir: str | Path, config: Any = None) -> MetricTracker:
    """Build ``tracker_cls(run_dir, config)`` (the default config unless given) and log a few steps, NaN and inf
    included (a tracker
    must never end a run over a value), call ``resume`` and ``summary`` when it has them, then
    ``close``. Returns the closed tracker for asserts on what it wrote."""
    from armor_core.config.schema import load_config

    tracker = tracker_cls(run_dir, config if config is not None else load_config(None, []))
    for step, value in ((1, 0.5), (2, math.nan), (3, math.inf)):
        tracker.log({"critic/score/mean": value, "timing_s/step": 0.1 * step}, step)
    if (resume := capability("metric_tracker", tracker, "resume")) is not None:
        resume(2)
        tracker.log({"critic/score/mean": 0.75}, 3)
    if (summary := capability("metric_tracker", tracker, "summary")) is not None:
        summary({"steps": 3})
    tracker.close()
    return tracker


#: the check for each plugin kind (``interfaces.KINDS``)
CHECKS = {
    "advantage_estimator": check_advantage_estimator,
    "policy_loss": check_policy_loss,
    "kl_estimator": check_kl_estimator,
    "loss_aggregation": check_loss_aggregation,
    "reward_domain": check_reward_domain,
    "stability_guard": check_guard,
    "rollout_backend": check_rollout_backend,
    "task": check_task,
    "metric_tracker": check_metric_tracker,
    "environment": check_environment,
}
