"""Multi-turn rollouts: episodes of assistant turns and environment observations, token-exact.

``MultiTurnRollout`` wraps any rollout backend and is itself one (the trainer, the async rollout
worker and ``armor eval`` cannot tell them apart). For a batch of prompts it runs one episode per
row and sample (``n`` per prompt, interleaved as the backend's ``n``):

1. an environment is built per episode from the row (``rollout.multi_turn.environment``, a
   registered ``environment`` plugin), with one seed for the ``n`` episodes of a row;
2. each turn, the live episodes' contexts (the prompt's ids, then every id sampled and every
   observation id so far, never re-tokenised) go to the backend in one batch, with the episode's
   remaining token budget;
3. every live environment gets its turn at once (``asyncio.gather``; a plain ``step`` runs on a
   daemon thread of its own), so a slow tool does not serialise the batch;
4. observations become ids through the chat template (``observations.ObservationRenderer``) and
   are appended with ``response_mask`` 0 (never in a loss, the KL, the entropy or a length reward)
   and ``attention_mask`` 1 (the policy reads them).

An episode ends when its environment says ``done``, after ``max_turns`` turns, when its
``max_response_tokens`` budget (sampled and observation tokens together) is spent, or when its
environment fails (raises anything, ``SystemExit`` included; returns something that is not an
``EnvironmentStep``, or one whose ``reward_parts`` or ``metrics`` are not finite numbers; or takes longer
than ``step_timeout_s``, when a plain ``step`` is abandoned on its thread): each reason is counted
(``env/ended_<reason>``). Sampled ids and log-probs are kept exactly as the backend returned them: the
rollout's log-prob of every trained token is the one the token was drawn with.

The output adds to the backend's layout: ``reward_text`` (the final assistant turn, or the whole
transcript with ``reward_on: transcript``) for the reward domains, ``env_reward_parts`` (summed
``reward_parts``), ``episode`` (``{turns: [{role, start, end}], end, error, metrics}``: each turn's role
(``assistant`` for the policy's) and response positions; why it ended, the environment's failure or None, its
metrics summed: the reward domains get the last three as ``extra[EPISODE_KEY]``), and metrics ``env/turns``,
``env/observation_tokens``, ``env/masked_share``, ``env/observations_truncated``, ``env/env_errors`` and the
environment's own, averaged over episodes.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, cast

import numpy as np
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import AssistantTurn, EnvironmentStep, capability
from armor_core.ops.calls import describe, guarded, in_thread
from armor_core.ops.sample_seeds import SEED_KEY, mix, repeat_samples
from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS
from armor_core.workers.rollout.observations import ObservationError, ObservationRenderer, as_messages

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from armor_core.config.schema import MultiTurnConfig, RolloutConfig
    from armor_core.interfaces import RolloutBackend
    from armor_core.plugins import EnvironmentFactory

__all__ = ["END_REASONS", "Episode", "MultiTurnRollout", "environment_params", "numbers_problem"]

_ENV_SEED = 0x656E76  # mixed into a group's first row's sample seed to give its environments' seed
Sampled = tuple[list[list[int]], list[float]]  # a turn's kept sets (per sampled id; [] without replay), kept masses
END_REASONS = ("done", "max_turns", "max_response_tokens", "env_error", "env_timeout")
MAX_THREADS = 256  # plain (sync) environment calls of one batch running at once, each on a thread of its own


@dataclass
class Episode:
    """One episode's response: every id after the prompt, which were sampled, and their log-probs."""

    row: Mapping[str, Any]
    context: list[int]  # the prompt's ids, then everything appended
    prompt_len: int
    ids: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 for a sampled id, 0 for an observation id
    log_probs: list[float] = field(default_factory=list)
    # sampling-mask replay: each id's kept set ([] for an observation's) and kept mass (1 for an observation's)
    kept: list[list[int]] = field(default_factory=list)
    kept_mass: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # each assistant turn's text
    reward_parts: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    end: str | None = None
    error: str | None = None  # the environment's exception, when it failed
    env: Any = None
    turn: AssistantTurn | None = None  # the last assistant turn
    ended_with: str | None = None  # the text of the end-of-turn token it ended with, if it did
    segments: list[dict[str, Any]] = field(default_factory=list)  # {role, start, end}: whose ids are where
    seed: int | None = None  # its per-sample seed (``ops.sample_seeds``); turn k samples with mix(seed, k)

    def append(
        self,
        ids: list[int],
        log_probs: list[float] | None,
        role: str = "assistant",
        kept: Sampled | None = None,
    ) -> None:
        """Sampled ids (with their ``log_probs`` and, when sampling truncated, ``kept``: their kept sets and masses) or
        an observation's (``log_probs`` None, ``role`` its messages')."""
        if ids:
            self.segments.append({"role": role, "start": len(self.ids), "end": len(self.ids) + len(ids)})
        self.ids += ids
        self.context += ids
        self.sampled += [1 if log_probs is not None else 0] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)
        sets, mass = kept if kept is not None else ([[] for _ in ids], [1.0] * len(ids))
        self.kept += sets[: len(ids)]
        self.kept_mass += mass[: len(ids)]


class MultiTurnRollout:
    """A rollout backend running episodes with environments over an inner backend (see the module docstring)."""

    def __init__(
        self,
        inner: RolloutBackend,
        tokenizer: PreTrainedTokenizerBase,
        config: RolloutConfig,
        env_cls: EnvironmentFactory,
    ) -> None:
        self.inner, self.tokenizer, self.config = inner, tokenizer, config
        self.mt = config.multi_turn
        self.env_cls = env_cls
        self.eos = set(capability("rollout_backend", inner, "eos_token_ids") or [tokenizer.eos_token_id])
        self.renderer = ObservationRenderer(tokenizer, max_tokens=self.mt.max_observation_tokens)
        self.shares_module = capability("rollout_backend", inner, "shares_module")
        self.separate_worker = capability("rollout_backend", inner, "separate_worker")

    @property
    def model(self) -> torch.nn.Module | None:
        return getattr(self.inner, "model", None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    # -- episodes --------------------------------------------------------------------------------

    def generate(self, prompts: DataProto, greedy: bool = False, **overrides: Any) -> DataProto:
        n, per_turn = int(overrides.pop("n", 1)), int(overrides.pop("max_new_tokens", self.config.max_new_tokens))
        prompts = repeat_samples(prompts, n)
        episodes = self._start(prompts, n)
        asyncio.run(self._run(episodes, per_turn, greedy, overrides))
        return self._assemble(prompts, episodes)

    def _start(self, prompts: DataProto, n: int) -> list[Episode]:
        ids, mask = prompts.tensors["input_ids"].tolist(), prompts.tensors["attention_mask"].tolist()
        nt, seeds = prompts.non_tensors, prompts.tensors.get(SEED_KEY)
        episodes = []
        for i, (row_ids, row_mask) in enumerate(zip(ids, mask)):
            context = [t for t, m in zip(row_ids, row_mask) if m]
            row = {key: values[i] for key, values in nt.items()}
            episodes.append(Episode(row, context, len(context), seed=int(seeds[i]) if seeds is not None else None))
        # one seed per prompt, shared by its n episodes: a row's group is its uid (the trainer repeats the prompts
        # itself), or its n consecutive copies (this call's own n)
        groups = [ep.row.get("uid", i // n) for i, ep in enumerate(episodes)]
        order = list(dict.fromkeys(_hashable(g) for g in groups))
        if seeds is not None:  # per-sample seeds: a group's environment seed from its first row's, as its samples
            first: dict[Any, Any] = {}
            for g, ep in zip(map(_hashable, groups), episodes):
                first.setdefault(g, ep.seed)
            drawn = {g: int(mix(first[g], _ENV_SEED)[0]) & (2**31 - 1) for g in order}
        else:
            drawn = dict(zip(order, torch.randint(0, 2**31 - 1, (len(order),)).tolist()))
        params = environment_params(self.env_cls, self.mt)
        for ep, group in zip(episodes, groups):
            ep.env = self.env_cls(ep.row, seed=drawn[_hashable(group)], **params)
        return episodes

    async def _run(self, episodes: list[Episode], per_turn: int, greedy: bool, overrides: dict) -> None:
        budget, self._threads = self.mt.max_response_tokens, asyncio.Semaphore(MAX_THREADS)
        for ep in episodes:  # a first observation (usually none)
            first = await self._call(ep, ep.env.reset)
            if isinstance(first, _Failed):
                ep.end = first.reason
            elif first is not None:
                self._observe(ep, first, None, budget)
        for index in range(self.mt.max_turns):
            live = [ep for ep in episodes if ep.end is None]
            if not live:
                break
            room = min(per_turn, max(budget - len(ep.ids) for ep in live))
            seeds = [ep.seed for ep in live]
            turn_seeds = mix(np.array(seeds, dtype=np.int64), index) if None not in seeds else None
            turns = self._sample([ep.context for ep in live], room, greedy, overrides, turn_seeds)
            for ep, (ids, lps, kept) in zip(live, turns):
                ids, lps = ids[: budget - len(ep.ids)], lps[: budget - len(ep.ids)]
                ep.append(ids, lps, kept=kept)
                finished = bool(ids) and ids[-1] in self.eos
                # one sequence of ids decodes to one string
                ep.turns.append(cast(str, self.tokenizer.decode(ids, skip_special_tokens=True)))
                ep.turn = AssistantTurn(ep.turns[-1], tuple(ids), index, finished)
                ep.ended_with = cast(str, self.tokenizer.decode(ids[-1:])) if finished else None
            results = await asyncio.gather(*(self._call(ep, ep.env.step, ep.turn) for ep in live))
            for ep, result in zip(live, results):
                self._apply(ep, result, budget, last_turn=index == self.mt.max_turns - 1)
        for ep in episodes:
            ep.end = ep.end or "max_turns"
            close = capability("environment", ep.env, "close")
            if close is not None:
                await self._call(ep, close)

    def _sample(
        self, contexts: list[list[int]], room: int, greedy: bool, overrides: dict, seeds: torch.Tensor | None = None
    ) -> list[tuple]:
        """One turn of every live episode, ``seeds`` (per-sample seeds: each episode's, mixed with the turn) given."""
        width, pad = max(len(c) for c in contexts), getattr(self.inner, "pad_token_id", None) or 0
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], dtype=torch.long)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        tensors = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
        batch = DataProto.from_dict(tensors={**tensors, **({SEED_KEY: seeds} if seeds is not None else {})})
        out = self.inner.generate(batch, greedy=greedy, max_new_tokens=max(room, 1), **overrides)
        rows, sets = [], out[KEPT_IDS].tolist() if KEPT_IDS in out else None
        masses = out[KEPT_MASS].tolist() if KEPT_MASS in out else None
        for j, (r, m, lp) in enumerate(
            zip(out["responses"].tolist(), out["response_mask"].tolist(), out["rollout_log_probs"].tolist())
        ):
            keep = [i for i, k in enumerate(m) if k]
            kept = None
            if masses is not None:
                kept = (
                    [[v for v in sets[j][i] if v >= 0] for i in keep] if sets is not None else [[] for _ in keep],
                    [masses[j][i] for i in keep],
                )
            rows.append(([r[i] for i in keep], [lp[i] for i in keep], kept))
        return rows

    async def _call(self, ep: Episode, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` within ``step_timeout_s``: awaited on this loop if async (an environment may keep state
        bound to it), else on a daemon thread of its own (``ops.calls.in_thread``: one that never returns is
        abandoned, and holds up neither the other episodes nor the worker's exit). A failure, ``SystemExit``
        included, comes back as ``_Failed`` (the episode ends, counted), never as an exception."""
        try:
            if inspect.iscoroutinefunction(fn):
                outcome = await asyncio.wait_for(guarded(fn(*args)), self.mt.step_timeout_s)
            else:
                async with self._threads:
                    outcome = await asyncio.wait_for(in_thread(fn, *args), self.mt.step_timeout_s)
        except asyncio.TimeoutError:
            ep.error = ep.error or f"no answer within rollout.multi_turn.step_timeout_s={self.mt.step_timeout_s:g}"
            return _Failed("env_timeout")
        if outcome.error is not None:  # the environment's failure ends its episode, the run goes on
            ep.error = ep.error or describe(outcome.error)
            return _Failed("env_error")
        return outcome.value

    def _apply(self, ep: Episode, result: Any, budget: int, last_turn: bool) -> None:
        if isinstance(result, _Failed):
            ep.end = result.reason
            return
        problem = (
            f"returned {type(result).__name__}, not an EnvironmentStep"
            if not isinstance(result, EnvironmentStep)
            else numbers_problem(result.reward_parts, "reward_parts") or numbers_problem(result.metrics, "metrics")
        )
        if problem:  # none of the step is kept: a text or NaN part would fail the batch's rewards
            ep.end = "env_error"
            ep.error = ep.error or f"step {problem}"
            ep.metrics["env_errors"] = ep.metrics.get("env_errors", 0.0) + 1
            return
        for k, v in result.reward_parts.items():
            ep.reward_parts[k] = ep.reward_parts.get(k, 0.0) + float(v)
        for k, v in result.metrics.items():
            ep.metrics[k] = ep.metrics.get(k, 0.0) + float(v)
        if result.done:
            ep.end = "done"
        elif len(ep.ids) >= budget:
            ep.end = "max_response_tokens"
        elif not last_turn and result.observation is not None:
            self._observe(ep, result.observation, ep.ended_with, budget)

    def _observe(self, ep: Episode, observation: Any, ended_with: str | None, budget: int) -> None:
        try:
            ids, cut = self.renderer.render(observation, ended_with)
        except ObservationError:
            ep.end = "env_error"
            ep.metrics["env_errors"] = ep.metrics.get("env_errors", 0.0) + 1
            return
        ep.metrics["observations_truncated"] = ep.metrics.get("observations_truncated", 0.0) + cut
        if len(ep.ids) + len(ids) >= budget:  # no room left to answer it
            ep.end = "max_response_tokens"
            return
        ep.append(ids, None, role=",".join(dict.fromkeys(m["role"] for m in as_messages(observation))))

    # -- output ------------------------------------------------------------------------------------

    def _assemble(self, prompts: DataProto, episodes: list[Episode]) -> DataProto:
        width = max([len(ep.ids) for ep in episodes] + [1])
        pad = getattr(self.inner, "pad_token_id", None) or 0
        rows = len(episodes)
        responses = torch.full((rows, width), pad, dtype=torch.long)
        response_mask = torch.zeros((rows, width), dtype=torch.long)
        present = torch.zeros((rows, width), dtype=torch.long)
        log_probs = torch.zeros((rows, width), dtype=torch.float32)
        for i, ep in enumerate(episodes):
            k = len(ep.ids)
            responses[i, :k] = torch.tensor(ep.ids, dtype=torch.long)
            response_mask[i, :k] = torch.tensor(ep.sampled, dtype=torch.long)
            present[i, :k] = 1
            log_probs[i, :k] = torch.tensor(ep.log_probs, dtype=torch.float32)
        input_ids, attention = prompts.tensors["input_ids"], prompts.tensors["attention_mask"]
        position_ids = prompts.tensors.get("position_ids")
        if position_ids is None:
            position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
        steps = torch.arange(1, width + 1, dtype=position_ids.dtype)
        tensors = {
            "prompts": input_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([input_ids, responses], dim=1),
            "attention_mask": torch.cat([attention.to(present.dtype), present], dim=1),
            "position_ids": torch.cat([position_ids, position_ids[:, -1:] + steps], dim=1),
            "rollout_log_probs": log_probs,
            **_kept_tensors(episodes, width),
        }
        transcript = self.mt.reward_on == "transcript"
        non_tensors = {
            **dict(prompts.non_tensors),
            "reward_text": [
                self.tokenizer.decode(ep.ids, skip_special_tokens=True) if transcript else (ep.turns or [""])[-1]
                for ep in episodes
            ],
            "env_reward_parts": [dict(ep.reward_parts) for ep in episodes],
            # each turn's role and response positions [start, end); why it ended, its failure, its summed env metrics
            "episode": [
                {"turns": list(ep.segments), "end": ep.end, "error": ep.error, "metrics": dict(ep.metrics)}
                for ep in episodes
            ],
        }
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={
            **dict(prompts.meta_info), "metrics": _metrics(episodes, response_mask, present)
        })  # fmt: skip


def _kept_tensors(episodes: list[Episode], width: int) -> dict[str, torch.Tensor]:
    """The episodes' kept sets and masses (sampling-mask replay) as the rollout's ``rollout_kept_ids`` and
    ``rollout_kept_mass``, (rows, width[, K]); none when no turn truncated its sampling."""
    if all(m == 1.0 for ep in episodes for m in ep.kept_mass):
        return {}
    mass = torch.ones((len(episodes), width), dtype=torch.float32)
    for i, ep in enumerate(episodes):
        mass[i, : len(ep.kept_mass)] = torch.tensor(ep.kept_mass, dtype=torch.float32)
    out = {KEPT_MASS: mass}
    k = max((len(s) for ep in episodes for s in ep.kept), default=0)
    if k:
        ids = torch.full((len(episodes), width, k), -1, dtype=torch.int32)
        for i, ep in enumerate(episodes):
            for t, kept in enumerate(ep.kept):
                ids[i, t, : len(kept)] = torch.tensor(kept, dtype=torch.int32)
        out[KEPT_IDS] = ids
    return out


def environment_params(env_cls: EnvironmentFactory, mt: MultiTurnConfig) -> dict[str, Any]:
    """The keywords every episode's environment gets besides ``row`` and ``seed``: ``rollout.multi_turn.parser``
    and ``max_tool_calls_per_turn`` when its signature takes them, under ``environment_kwargs``."""
    try:
        accepted = inspect.signature(env_cls).parameters
    except (TypeError, ValueError):
        accepted = {}
    shared = {"parser": mt.parser, "max_tool_calls_per_turn": mt.max_tool_calls_per_turn}
    return {**{k: v for k, v in shared.items() if k in accepted}, **dict(mt.environment_kwargs)}


def numbers_problem(values: Any, what: str) -> str | None:
    """Why ``values`` (an ``EnvironmentStep``'s ``reward_parts`` or ``metrics``) is not a mapping of str names to
    finite real numbers, or None when it is. ``bool`` is refused: a flag is not a score."""
    if not isinstance(values, Mapping):
        return f"{what} must be a mapping of name -> number, got {type(values).__name__}"
    for name, value in values.items():
        if not isinstance(name, str) or not isinstance(value, numbers.Real) or isinstance(value, bool):
            return f"{what}[{name!r}] = {value!r}; expected a number under a str name"
        if not math.isfinite(float(value)):
            return f"{what}[{name!r}] is not finite ({value})"
    return None


def _hashable(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


@dataclass(frozen=True)
class _Failed:
    reason: str


def _metrics(episodes: list[Episode], response_mask: torch.Tensor, present: torch.Tensor) -> dict[str, float]:
    n = max(len(episodes), 1)
    out = {
        "env/turns": sum(len(ep.turns) for ep in episodes) / n,
        "env/observation_tokens": float((present - response_mask).sum()) / n,
        "env/masked_share": float((present - response_mask).sum()) / max(float(present.sum()), 1.0),
    }
    for reason in END_REASONS:
        out[f"env/ended_{reason}"] = sum(ep.end == reason for ep in episodes) / n
    for key in sorted({k for ep in episodes for k in ep.metrics}):
        out[f"env/{key}"] = sum(ep.metrics.get(key, 0.0) for ep in episodes) / n
    return out
