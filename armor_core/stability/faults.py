"""Fault injection, for proving the StabilityGuard works (``benchmarks/stability.py``) and for tests.

``trainer.faults`` lists faults as ``{kind, steps, value}``; nothing is injected unless a user
asks. Kinds, and where they strike:

- ``nan_grad`` (actor worker): one gradient element becomes NaN after backward, before clipping;
  on the rank ``value`` only when given (every rank must still skip together).
- ``lr_scale`` (actor worker): the learning rate is multiplied by ``value`` for these updates.
- ``flip_reward`` / ``random_reward`` (driver): scores become ``1 - score`` / uniform in [0, 1]; with ``value``
  (a fraction in (0, 1]) ``flip_reward`` flips that fraction of the rows, drawn anew each step (noisy labels).
- ``inf_reward`` (driver): one row's score becomes +Inf.
- ``stale_rollout`` (actor worker): responses are sampled from the weights of ``value`` steps
  ago (default 4) while the trainer believes they are on-policy.
- ``kill_worker`` (actor worker): the actor worker of rank ``value`` (default 0) kills its own
  process with SIGKILL as its update of these steps begins, as the kernel's OOM killer would; the
  run must stop with a message naming the worker, keep its last checkpoint, and resume from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
from typing import Any, Iterable, Mapping

__all__ = ["FAULT_KINDS", "Faults", "parse_faults"]

FAULT_KINDS = ("nan_grad", "lr_scale", "flip_reward", "random_reward", "inf_reward", "stale_rollout", "kill_worker")


@dataclass(frozen=True)
class Fault:
    kind: str
    steps: frozenset[int]
    value: float | None = None


def parse_faults(specs: Iterable[Mapping[str, Any]]) -> list[Fault]:
    out = []
    for i, spec in enumerate(specs):
        where = f"trainer.faults[{i}]"
        if not isinstance(spec, Mapping) or "kind" not in spec or "steps" not in spec:
            raise ValueError(f"{where}={spec!r}: each fault is {{kind, steps, value}}")
        extra = set(spec) - {"kind", "steps", "value"}
        if extra:
            raise ValueError(f"{where} has unknown keys {sorted(extra)}; allowed: kind, steps, value")
        if spec["kind"] not in FAULT_KINDS:
            raise ValueError(f"{where}.kind={spec['kind']!r}; one of {', '.join(FAULT_KINDS)}")
        steps = spec["steps"]
        if isinstance(steps, Mapping):  # {from: a, to: b} inclusive
            steps = range(int(steps["from"]), int(steps["to"]) + 1)
        if spec["kind"] == "flip_reward" and spec.get("value") is not None and not 0 < float(spec["value"]) <= 1:
            raise ValueError(f"{where}.value={spec['value']!r}: flip_reward's value is the fraction of rows, in (0, 1]")
        out.append(
            Fault(
                spec["kind"],
                frozenset(int(s) for s in steps),
                None if spec.get("value") is None else float(spec["value"]),
            )
        )
    return out


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
