"""One training step on the driver, stage by stage: ``Step.run``.

    rows      RolloutSource.collect: generated (now, queued by the last update call, or by async
              rollout workers) and scored; dynamic sampling refills dropped groups   guard: reward
    logprobs  old log-probs (unless exactly on-policy), reference log-probs (KL), values (critic),
              the teacher's log-probs (on-policy distillation, ``loop/distill.py``)
    baseline  one greedy response per prompt, scored (an estimator with ``greedy_baseline``: ReMax)
    adv       KL-in-reward penalty, distillation reward, then the advantage estimator  guard: advantage
              (with the rollout's statistics: scores, lengths, the sampler's entropy)
    update    unless a guard said skip or rollback: its adjustments, the critic, then the actor
              (RolloutSource.update: with the next generation or the weight sync)

Timing (``StepTimer``), guards (``GuardRunner.observe`` per stage) and faults (``Faults``) are
collaborators called at the stage they concern. The trainer runs the loop around this: it counts
steps, shows the ``update`` stage to the guards, acts on the verdicts left to it (rollbacks, and
adjustments after them), and logs. The statistics each stage shows are ``interfaces.GUARD_STAGES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from armor_core.interfaces import EPISODE_KEY, Verdict, call_with_params
from armor_core.loop.distill import TEACHER_KEYS
from armor_core.loop.step_timer import StepTimer
from armor_core.models.routing_replay import ROUTES
from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS
from armor_core.workers.api import ActorAPI, CriticAPI

if TYPE_CHECKING:  # the collaborators' types; at run time the trainer hands them over
    from transformers import PreTrainedTokenizerBase

    from armor_core.config.schema import ArmorConfig
    from armor_core.dataproto.protocol import DataProto
    from armor_core.engine import WorkerGroup
    from armor_core.interfaces import AdvantageEstimator
    from armor_core.loop.baseline import GreedyBaseline
    from armor_core.loop.distill import Distillation
    from armor_core.loop.kl_penalty import AdaptiveKLController, FixedKLController
    from armor_core.loop.rollout_source import RolloutSource
    from armor_core.plugins import PluginManager
    from armor_core.rewards.manager import RewardManager
    from armor_core.stability.faults import Faults
    from armor_core.stability.guard import GuardRunner

__all__ = [
    "Scorer",
    "Step",
    "StepResult",
    "advantage_stats",
    "batch_metrics",
    "length_stats",
    "rollout_entropy",
    "score_stats",
    "send_adjustments",
    "update_stats",
]

UPDATE_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "advantages",
    "old_log_probs",
    "ref_log_prob",
    "rollout_log_probs",
    KEPT_IDS,
    ROUTES,
    *TEACHER_KEYS,
)


class Scorer:
    """Scores of generated rows: responses decoded, then ``RewardManager.score`` routes each row by its ``data_source``.

    Each row's components go into the batch as ``reward_components``, ``{domain: (score, weight)}``
    (its score is the weighted sum), for estimators that treat them separately (``normalize_components``).
    """

    def __init__(self, rewards: RewardManager, tokenizer: PreTrainedTokenizerBase) -> None:
        self.rewards, self.tokenizer = rewards, tokenizer

    def decode(self, batch: DataProto) -> list[str]:
        # plain lists and one batch_decode: per-row tensor indexing cost more than the decoding
        rows = [
            [t for t, keep in zip(r, m) if keep]
            for r, m in zip(batch["responses"].tolist(), batch["response_mask"].tolist())
        ]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def __call__(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        scores, metrics, _ = self.score(batch)
        return scores, metrics

    def score(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """(B,) scores, the reward metrics, and the decoded responses (validation votes on them)."""
        nt = batch.non_tensors
        lengths = batch["response_mask"].sum(-1).tolist()
        # the response's token count lets a domain apply a length penalty in tokens (DAPO's overlong shaping)
        extras = [{**(e or {}), "response_length": int(n)} for e, n in zip(nt["extra"], lengths)]
        if "episode" in nt:  # how each multi-turn episode went: a game's domain scores it, or fails the row
            for extra, episode in zip(extras, nt["episode"]):
                extra[EPISODE_KEY] = {k: episode.get(k) for k in ("end", "error", "metrics")}
        # a multi-turn rollout says what the domains score (the final turn or the transcript); else the response
        texts = list(nt["reward_text"]) if "reward_text" in nt else self.decode(batch)
        out = self.rewards.score(
            list(nt["raw_prompt"]), texts, list(nt["data_source"]), list(nt["ground_truth"]), extras
        )
        scores, components, metrics = list(out.scores), out.components, dict(out.metrics)
        if "env_reward_parts" in nt:  # an environment's own reward parts: components of weight 1 (GDPO sees them)
            scores, components, metrics = _with_environment_parts(scores, components, metrics, nt["env_reward_parts"])
        batch["reward_components"] = components
        return torch.as_tensor(scores, dtype=torch.float32), metrics, texts


def _with_environment_parts(
    scores: list[float], components: list[dict], metrics: dict[str, float], parts: np.ndarray
) -> tuple[list[float], list[dict], dict[str, float]]:
    """Scores plus each row's ``env_reward_parts``, added to its components as ``env:<name>`` (weight 1)."""
    components = [dict(c) for c in components]
    sums: dict[str, list[float]] = {}
    for i, row_parts in enumerate(parts):
        for name, value in (row_parts or {}).items():
            components[i][f"env:{name}"] = (float(value), 1.0)
            scores[i] += float(value)
            sums.setdefault(name, []).append(float(value))
    for name, values in sums.items():
        metrics[f"reward/env/{name}"] = sum(values) / len(scores)
    return scores, components, metrics


@dataclass
class StepResult:
    metrics: dict[str, float]
    timer: StepTimer
    # the reward and advantage stages' verdicts the trainer still has to act on: those of a step whose update
    # they skipped (a rollback, adjustments after it); empty when the update ran (their adjustments came first)
    verdicts: list[Verdict] = field(default_factory=list)
    batch: DataProto | None = None  # None: nothing was trained on (dynamic sampling kept no group)
    scores: torch.Tensor | None = None
    updated: bool = False  # the update ran (the trainer shows stage ``update`` only then)


class Step:
    """The stages of one step; built once per run by the trainer."""

    def __init__(
        self,
        cfg: ArmorConfig,
        pm: PluginManager,
        estimator: AdvantageEstimator,
        actor: WorkerGroup,
        critic: WorkerGroup | None,
        rollout: RolloutSource,
        scorer: Scorer,
        guard: GuardRunner,
        faults: Faults,
        kl_ctrl: FixedKLController | AdaptiveKLController | None,
        distill: Distillation | None = None,
        baseline: GreedyBaseline | None = None,
    ) -> None:
        self.cfg, self.pm, self.estimator = cfg, pm, estimator
        self.actor, self.critic, self.rollout, self.scorer = actor, critic, rollout, scorer
        self.guard, self.faults, self.kl_ctrl = guard, faults, kl_ctrl
        self.distill = distill  # on-policy distillation, or None
        self.baseline = baseline  # for a greedy_baseline estimator (ReMax), or None

    def run(self, step: int) -> StepResult:
        """Step ``step`` (1-based) up to and including the updates."""
        res = StepResult({}, StepTimer())
        batch, scores = self.rollout.collect(step, lambda b: self._scores(b, step), res.timer, res.metrics)
        if not len(batch):  # algorithm.filter_groups kept no group: nothing to learn from this step
            res.metrics["guard/skipped_step"] = 1.0
            return res
        batch["token_level_scores"] = _on_last_token(scores, batch["response_mask"])
        res.metrics.update(rollout_entropy(batch))  # known before the update: for the guards, and logged
        res.verdicts.append(self.guard.observe("reward", score_stats(scores), step))
        batch = self._log_probs(batch, res)
        baseline = self._baseline(batch, step, res)
        batch = self._advantages(batch, res, baseline)
        res.verdicts.append(self.guard.observe("advantage", advantage_stats(batch, scores, res.metrics), step))
        if any(v.action in ("skip", "rollback") for v in res.verdicts):
            res.metrics["guard/skipped_step"] = 1.0
        else:
            self._adjust(res)
            self._update(batch, step, res)
            res.updated = True
        res.batch, res.scores = batch, scores
        return res

    def _adjust(self, res: StepResult) -> None:
        """The reward and advantage stages' adjustments, applied on every actor rank before this step's update."""
        send_adjustments(self.actor, res.verdicts, res.metrics)
        res.verdicts = []  # nothing left for the trainer to act on

    def _scores(self, batch: DataProto, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        scores, metrics = self.scorer(batch)
        return self.faults.rewards(scores, step), metrics

    def _log_probs(self, batch: DataProto, res: StepResult) -> DataProto:
        """Old log-probs (unless the update is exactly on-policy), reference log-probs (KL), values (critic),
        the teacher's log-probs (distillation)."""
        cfg, timer = self.cfg, res.timer
        if not (cfg.actor.ppo_epochs == 1 and cfg.actor.ppo_mini_batch_size == cfg.data.train_batch_size):
            with timer("old_log_prob") as stage:
                old = self.actor.dispatch(ActorAPI.compute_log_prob, batch)
                stage.worker_s = old.meta_info.pop("metrics", {}).get("perf/worker_s")
            batch = batch.union(old.select(tensor_keys=["old_log_probs"]))
            if "rollout_log_probs" in batch:
                mask = batch["response_mask"].float()
                diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * mask
                res.metrics["rollout/logprob_diff_mean"] = (diff.sum() / mask.sum().clamp(min=1)).item()
                res.metrics["rollout/logprob_diff_max"] = diff.max().item()
        if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
            with timer("ref") as stage:
                ref = self.actor.dispatch(ActorAPI.compute_ref_log_prob, batch)
                stage.worker_s = ref.meta_info.pop("metrics", {}).get("perf/worker_s")
                batch = batch.union(ref)
        if self.critic is not None:
            with timer("values"):
                batch = batch.union(self.critic.dispatch(CriticAPI.compute_values, batch))
        if self.distill is not None:
            batch = self.distill.teacher_pass(batch, timer, res.metrics)
        return batch

    def _baseline(self, batch: DataProto, step: int, res: StepResult) -> torch.Tensor | None:
        """The greedy responses' scores, one per prompt, for an estimator that reads ``baseline_scores``."""
        if self.baseline is None:
            return None
        with res.timer("baseline"):
            scores, metrics = self.baseline(batch, step)
        res.metrics.update(metrics)
        return scores

    def _advantages(self, batch: DataProto, res: StepResult, baseline: torch.Tensor | None = None) -> DataProto:
        """The KL penalty and the distillation reward folded into the reward (if configured), then the advantage
        estimator."""
        a, mask = self.cfg.algorithm, batch["response_mask"].float()
        with res.timer("adv"):
            if self.kl_ctrl is not None:
                from armor_core.loop.kl_penalty import apply_kl_penalty

                behaviour = batch["old_log_probs"] if "old_log_probs" in batch else batch["rollout_log_probs"]
                kl_est = self.pm.get("kl_estimator", a.kl_penalty, where="algorithm.kl_penalty")
                rewards, kl_m = apply_kl_penalty(
                    batch["token_level_scores"], behaviour, batch["ref_log_prob"], mask, self.kl_ctrl.value, kl_est
                )
                self.kl_ctrl.update(kl_m["reward_kl"], self.cfg.data.train_batch_size)
                res.metrics.update({f"actor/{k}": v for k, v in kl_m.items()})
            else:
                rewards = batch["token_level_scores"]
            if self.distill is not None:
                rewards = self.distill.rewards(batch, rewards)
            batch["token_level_rewards"] = rewards
            available = {
                "values": batch["values"] if "values" in batch else None,
                "gamma": a.gamma,
                "lam": a.lam,
                "norm_adv_by_std": a.norm_adv_by_std,
                "reward_components": batch["reward_components"] if "reward_components" in batch else None,
                "baseline_scores": baseline,
            }
            index = torch.as_tensor(np.asarray(batch.non_tensors["uid"], dtype=np.int64))
            adv, ret = call_with_params(
                self.estimator.fn,
                rewards,
                mask,
                index,
                available=available,
                extra=a.adv_kwargs,
                where="algorithm.adv_kwargs",
            )
            batch["advantages"], batch["returns"] = adv.float(), ret.float()
        res.metrics.update(_masked_stats("critic/advantages", adv, mask))
        res.metrics.update(_masked_stats("critic/returns", ret, mask))
        return batch

    def _update(self, batch: DataProto, step: int, res: StepResult) -> None:
        if self.critic is not None:
            with res.timer("update_critic"):
                res.metrics.update(self.critic.dispatch(CriticAPI.update_critic, batch, step))
        update_in = batch.select(tensor_keys=[k for k in UPDATE_KEYS if k in batch])
        res.metrics.update(self.rollout.update(update_in, step, res.timer))


def send_adjustments(actor: WorkerGroup, verdicts: list[Verdict], metrics: dict[str, float]) -> None:
    """Every verdict's adjustments, merged (``merge_adjustments``), sent to each actor rank and logged as
    ``guard/adjust/<coefficient>``; nothing is sent when there are none."""
    from armor_core.stability.guard import merge_adjustments

    adjustments = merge_adjustments(verdicts)
    if adjustments:
        actor.call(ActorAPI.apply_adjustments, adjustments)
        metrics.update({f"guard/adjust/{k}": float(v) for k, v in adjustments.items()})


def _on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each row's score on its last response token (0 elsewhere), as token-level rewards. The last token is
    the last position the mask holds, not the count of them: a multi-turn mask has observation gaps."""
    mask = response_mask.float()
    width = mask.shape[-1]
    last = width - 1 - mask.flip(-1).argmax(-1)  # argmax finds the first 1 of the reversed row
    out = torch.zeros_like(mask)
    has = mask.sum(-1) > 0
    out[has, last[has]] = scores[has]
    return out


def _masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    m = mask.bool()
    if not m.any():
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    v = x[m].float()
    return {f"{prefix}/mean": v.mean().item(), f"{prefix}/max": v.max().item(), f"{prefix}/min": v.min().item()}


def score_stats(scores: torch.Tensor) -> dict[str, float]:
    """``score/mean``, ``/min``, ``/max`` of the rows' scores (guard stages ``reward`` and ``advantage``)."""
    return {"score/mean": scores.mean().item(), "score/min": scores.min().item(), "score/max": scores.max().item()}


def length_stats(batch: DataProto) -> dict[str, float]:
    """``response_length/mean``, ``/max``, ``/min`` (tokens the response mask holds) and ``/clip_ratio``, the share of
    responses that reached the batch's response width (``rollout.max_new_tokens``: cut off, not finished)."""
    resp_len = batch["response_mask"].float().sum(-1)
    return {
        "response_length/mean": resp_len.mean().item(),
        "response_length/max": resp_len.max().item(),
        "response_length/min": resp_len.min().item(),
        "response_length/clip_ratio": (resp_len >= batch["responses"].shape[1]).float().mean().item(),
    }


def rollout_entropy(batch: DataProto) -> dict[str, float]:
    """``rollout/entropy``: the mean of ``-rollout_log_probs`` over the response tokens the mask holds, an unbiased
    estimate of the sampler's per-token entropy (``E[-log p(x)]`` for ``x`` drawn from ``p``), known before the
    update; ``{}`` when the backend returned no log-probs. ``rollout/kept_mass``: the mean share of the policy's
    probability that top-k / top-p sampling kept, when it truncated."""
    if "rollout_log_probs" not in batch:
        return {}
    mask = batch["response_mask"].float()
    out = {"rollout/entropy": float(-(batch["rollout_log_probs"].float() * mask).sum() / mask.sum().clamp(min=1))}
    if KEPT_MASS in batch:  # the share of the policy's mass sampling kept (sampling-mask replay)
        out["rollout/kept_mass"] = float((batch[KEPT_MASS].float() * mask).sum() / mask.sum().clamp(min=1))
    return out


def advantage_stats(batch: DataProto, scores: torch.Tensor, metrics: dict[str, float]) -> dict[str, float]:
    """What guard stage ``advantage`` shows: the rollout's scores, lengths and sampler entropy, the advantages, and
    every ``rollout/*`` statistic the step knows by then (``interfaces.GUARD_STAGES["advantage"]``)."""
    known = {k: v for k, v in metrics.items() if k.startswith(("critic/advantages/", "rollout/"))}
    return {**score_stats(scores), **length_stats(batch), **known}


def update_stats(metrics: dict[str, float]) -> dict[str, float]:
    """What guard stage ``update`` shows: every ``actor/*``, ``rollout/*`` and (an MoE model's) ``moe/*`` metric of a
    step whose update ran (``interfaces.GUARD_STAGES["update"]``)."""
    return {k: v for k, v in metrics.items() if k.startswith(("actor/", "rollout/", "moe/"))}


def batch_metrics(batch: DataProto, scores: torch.Tensor) -> dict[str, float]:
    """Scores, rewards and lengths of the batch a step trained on. ``prompt_length/mean`` counts the prompt's
    tokens only (the attention mask before the response), not the observations a multi-turn episode appended."""
    lengths = length_stats(batch)
    prompt_width = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    return {
        "critic/score/mean": scores.mean().item(),
        "critic/score/max": scores.max().item(),
        "critic/score/min": scores.min().item(),
        "critic/rewards/mean": (batch["token_level_rewards"].sum(-1)).mean().item(),
        **lengths,
        "prompt_length/mean": float(batch["attention_mask"][:, :prompt_width].sum(-1).float().mean()),
    }
