"""Fault injection, for proving the StabilityGuard works (``benchmarks/stability.py``) and for tests.

``trainer.faults`` lists faults as ``{kind, steps, value}``; nothing is injected unless a user asks.
``steps``: the steps the fault strikes, the trainer's 1-based step numbers, as a list (``[3, 7]``) or
an inclusive range (``{from: 80, to: 89}``). ``value``: what it means depends on the kind (below);
a kind that reads no value refuses one. Kinds, where they strike, and their ``value``:

- ``nan_grad`` (actor worker): one gradient element becomes NaN after backward, before clipping.
  ``value``: the rank whose gradient it is (every rank must still skip together); default: every rank.
- ``lr_scale`` (actor worker): the learning rate of these updates' optimizer steps is multiplied by
  ``value`` (required, >= 0; e.g. 100), then put back; ``actor/lr`` reports the rate used.
- ``flip_reward`` (driver): scores become ``1 - score``. ``value``: the fraction of rows flipped, in
  (0, 1], drawn anew each step from the step alone (noisy labels); default: every row.
- ``random_reward`` (driver): scores become uniform in [0, 1], seeded by the step. No ``value``.
- ``inf_reward`` (driver): the first row's score becomes +Inf. No ``value``.
- ``stale_rollout`` (actor worker): responses are sampled from the weights of ``value`` updates ago
  (a whole number >= 1, default 4; the first ``stale_rollout`` fault's value holds for all) while the
  trainer believes they are on-policy.
- ``kill_worker`` (actor worker): the actor worker of rank ``value`` (default 0) kills its own
  process with SIGKILL as its update of these steps begins, as the kernel's OOM killer would; the
  run must stop with a message naming the worker, keep its last checkpoint, and resume from it.
- ``lost_sync`` (actor worker): the weight sync after these steps' updates leaves out the first tensor it
  would send, as a backend that skips one would, so the engine keeps an old copy of it; only a rollout
  engine with weights of its own is synced (``vllm``, an FSDP2 copy). With ``rollout.verify_sync`` the run
  stops with a ``SyncCheckError`` naming the tensor, recorded in ``guard_events.jsonl``. No ``value``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    import torch

__all__ = ["FAULT_KINDS", "VALUES", "Faults", "parse_faults"]

FAULT_KINDS = (
    "nan_grad",
    "lr_scale",
    "flip_reward",
    "random_reward",
    "inf_reward",
    "stale_rollout",
    "kill_worker",
    "lost_sync",
)


@dataclass(frozen=True)
class Fault:
    kind: str
    steps: frozenset[int]
    value: float | None = None


#: what ``value`` is for each kind that reads one: (meaning, required, smallest value, whole number)
VALUES: dict[str, tuple[str, bool, float, bool]] = {
    "nan_grad": ("the rank whose gradient becomes NaN (default: every rank)", False, 0, True),
    "lr_scale": ("the factor the learning rate is multiplied by", True, 0, False),
    "stale_rollout": ("how many updates old the sampling weights are (default 4)", False, 1, True),
    "kill_worker": ("the rank of the actor worker that is killed (default 0)", False, 0, True),
    "flip_reward": ("the fraction of rows flipped, in (0, 1] (default: every row)", False, 0, False),
}


def parse_faults(specs: Iterable[Mapping[str, Any]]) -> list[Fault]:
    """``trainer.faults`` checked and parsed; a ValueError names ``trainer.faults[i]`` and what would be right."""
    out = []
    for i, spec in enumerate(specs):
        where = f"trainer.faults[{i}]"
        if not isinstance(spec, Mapping) or "kind" not in spec or "steps" not in spec:
            raise ValueError(f"{where}={spec!r}: each fault is {{kind, steps, value}}")
        extra = set(spec) - {"kind", "steps", "value"}
        if extra:
            raise ValueError(f"{where} has unknown keys {sorted(extra)}; allowed: kind, steps, value")
        kind = spec["kind"]
        if kind not in FAULT_KINDS:
            raise ValueError(f"{where}.kind={kind!r}; one of {', '.join(FAULT_KINDS)}")
        steps = spec["steps"]
        if isinstance(steps, Mapping):  # {from: a, to: b} inclusive
            if set(steps) != {"from", "to"}:
                raise ValueError(f"{where}.steps={dict(steps)!r}: a range is {{from: first, to: last}} (inclusive)")
            steps = range(int(steps["from"]), int(steps["to"]) + 1)
        elif isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise ValueError(f"{where}.steps={steps!r}: a list of steps ([3, 7]) or a range ({{from: 3, to: 7}})")
        out.append(Fault(kind, frozenset(int(s) for s in steps), _value(where, kind, spec.get("value"))))
    return out


def _value(where: str, kind: str, value: Any) -> float | None:
    if kind not in VALUES:
        if value is not None:
            raise ValueError(f"{where}: {kind} takes no value (got {value!r}); leave it out")
        return None
    meaning, required, low, whole = VALUES[kind]
    if value is None:
        if required:
            raise ValueError(f"{where}: {kind} needs a value, {meaning}")
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if kind == "flip_reward" and not 0 < v <= 1:
        raise ValueError(f"{where}.value={value!r}: {kind}'s value is {meaning}")
    if isinstance(value, bool) or not v >= low or (whole and v != int(v)):
        number = f"a {'whole ' if whole else ''}number >= {low:g}"
        raise ValueError(f"{where}.value={value!r}: {kind}'s value is {meaning}, {number}")
    return v


class Faults:
    def __init__(self, specs: Iterable[Mapping[str, Any]]) -> None:
        self.faults = parse_faults(specs)

    def at(self, kind: str, step: int) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and step in f.steps:
                return f
        return None

    def any(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)

    def rewards(self, scores: torch.Tensor, step: int) -> torch.Tensor:
        """The driver's reward faults at ``step`` applied to ``scores`` (unchanged when none strikes)."""
        import torch

        flip = self.at("flip_reward", step)
        if flip:
            if flip.value is None:
                scores = 1.0 - scores
            else:  # a fraction of the rows, chosen by the step alone (the same rows on a replay)
                chosen = torch.rand(scores.shape, generator=torch.Generator().manual_seed(7919 * step + 1)) < flip.value
                scores = torch.where(chosen, 1.0 - scores, scores)
        if self.at("random_reward", step):
            scores = torch.rand(scores.shape, generator=torch.Generator().manual_seed(step))
        if self.at("inf_reward", step):
            scores = scores.clone()
            scores[0] = float("inf")
        return scores
