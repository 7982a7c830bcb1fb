"""StabilityGuard: runs the configured guard plugins on each stage's statistics and combines verdicts.

Guards are plugins (``armor_register_stability_guards``); the config lists them in order
(``guard.guards: [{name, params}]``). For each stage of a step the trainer (or, for the ``grad``
stage, each actor worker) calls ``GuardRunner.observe(stage, stats, step)``; every guard sees the
stats and returns a :class:`~armor_core.interfaces.Verdict`, and the most severe one wins
(rollback > skip > scale > adjust > proceed). Guards see only scalar statistics that are already
reduced across data-parallel ranks, so every rank reaches the same verdict without a message.

Every verdict other than ``proceed`` is appended to ``guard_events.jsonl`` in the run directory and
counted in the step's metrics (``guard/<guard>/<action>``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from pathlib import Path
from typing import Any, Mapping

from armor_core.errors import ConfigError
from armor_core.interfaces import ADJUSTABLE_COEFFICIENTS, OPTIONAL_STATS, Verdict

__all__ = ["GuardRunner", "SEVERITY", "build_guards", "combine", "merge_adjustments", "run_coefficients"]

SEVERITY = {"proceed": 0, "adjust": 1, "scale": 2, "skip": 3, "rollback": 4}

#: stages a guard must ask for by name (in its ``stages`` attribute): each costs something extra
OPT_IN_STAGES = frozenset({"step"})


#: when two guards adjust the same coefficient, the more cautious value wins
_CAUTIOUS = {"lr": min, "clip_ratio_low": min, "clip_ratio_high": min, "kl_loss_coef": max, "entropy_coeff": max}
assert set(_CAUTIOUS) == set(ADJUSTABLE_COEFFICIENTS), "every adjustable coefficient needs a cautious merge rule"


def merge_adjustments(verdicts: list[Verdict]) -> dict[str, float]:
    """All guards' adjustments together; conflicts resolved toward the safer value."""
    merged: dict[str, float] = {}
    for v in verdicts:
        for key, value in v.adjustments.items():
            merged[key] = _CAUTIOUS.get(key, min)(merged[key], value) if key in merged else value
    return merged


def combine(verdicts: list[tuple[str, Verdict]]) -> tuple[str | None, Verdict]:
    """The most severe verdict (the first of equals), with the name of the guard that gave it."""
    best_name, best = None, Verdict.proceed()
    for name, v in verdicts:
        if SEVERITY[v.action] > SEVERITY[best.action]:
            best_name, best = name, v
    return best_name, best


def run_coefficients(actor_cfg: Any) -> dict[str, float]:
    """The run's value of every adjustable coefficient (``actor.lr``, ``actor.kl_loss_coef``, ...)."""
    return {k: float(getattr(actor_cfg, k)) for k in ADJUSTABLE_COEFFICIENTS if hasattr(actor_cfg, k)}


def build_guards(
    specs: list[Mapping[str, Any]], pm: Any = None, run_values: Mapping[str, float] | None = None
) -> list[tuple[str, Any]]:
    """Each configured guard, built: ``[(label, instance)]`` in the config's order.

    A constructor parameter named after an adjustable coefficient (``lr``, ``kl_loss_coef``, ``entropy_coeff``,
    ``clip_ratio_low``, ``clip_ratio_high``) that the guard's ``params`` do not set is filled with the run's value
    from ``run_values``, so a guard that lowers a coefficient and later restores it restores the run's own.
    The label is the guard's name, or ``name#i`` (its position) when the name is listed more than once, so two
    instances keep their state, events and counts apart.

    :raises ConfigError: naming ``guard.guards[i]``, for an unknown guard or a parameter its constructor refuses;
        ``armor run`` builds them once this way before any worker starts (``loop.preflight``).
    """
    from armor_core.plugins import get_plugin_manager

    pm = pm or get_plugin_manager()
    names = [spec["name"] for spec in specs]
    built = []
    for i, spec in enumerate(specs):
        cls = pm.get("stability_guard", spec["name"], where=f"guard.guards[{i}].name")
        params = dict(spec.get("params") or {})
        try:
            declared = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            declared = {}
        for key, value in (run_values or {}).items():
            if key in declared and key not in params:
                params[key] = value
        try:
            guard = cls(**params)
        except (TypeError, ValueError) as e:  # unknown keyword, or a value the guard checks and refuses
            named = f"guard.guards[{i}]" if spec["name"] in str(e) else f"guard.guards[{i}] ({spec['name']})"
            raise ConfigError(f"{named}: {e}") from None
        _check_needs(guard, f"guard.guards[{i}] ({spec['name']})")
        built.append((spec["name"] if names.count(spec["name"]) == 1 else f"{spec['name']}#{i}", guard))
    return built


def _check_needs(guard: Any, where: str) -> None:
    """A guard's ``needs`` must name optional statistics of a stage it observes."""
    stages = getattr(guard, "stages", None)
    for stat in getattr(guard, "needs", ()):
        if stat not in OPTIONAL_STATS:
            raise ConfigError(
                f"{where} needs {stat!r}, which no stage measures; optional statistics: {list(OPTIONAL_STATS)}"
            )
        stage = OPTIONAL_STATS[stat]
        if stages is None or stage not in stages:
            raise ConfigError(f"{where} needs {stat!r}, measured at stage {stage!r}: list {stage!r} in its `stages`")


class GuardRunner:
    """Holds the guard instances of one process.

    :param guards: ``[{name, params}]`` from ``guard.guards``.
    :param run_dir: where ``guard_events.jsonl`` goes (None: events are only counted).
    :param run_values: the run's adjustable coefficients (``run_coefficients(cfg.actor)``), see ``build_guards``.
    """

    def __init__(
        self,
        guards: list[Mapping[str, Any]],
        pm: Any = None,
        run_dir: str | Path | None = None,
        enable: bool = True,
        run_values: Mapping[str, float] | None = None,
    ) -> None:
        self.enable = enable
        self.guards: list[tuple[str, Any]] = build_guards(guards, pm, run_values) if enable else []
        self.events_path = Path(run_dir) / "guard_events.jsonl" if run_dir else None
        self.counts: dict[str, float] = {}

    @staticmethod
    def _sees(guard: Any, stage: str) -> bool:
        stages = getattr(guard, "stages", None)
        return stage in stages if stages is not None else stage not in OPT_IN_STAGES

    def watches(self, stage: str) -> bool:
        """Whether any guard observes ``stage`` (the worker measures ``step`` stats only then)."""
        return any(self._sees(g, stage) for _, g in self.guards)

    def watches_at(self, stage: str, step: int) -> bool:
        """Whether a guard observing ``stage`` wants it at ``step``: one without ``needs_at`` always does, one with
        it when ``needs_at(step)`` says so (a costly stage is measured only then)."""
        return any(
            self._sees(g, stage) and (not hasattr(g, "needs_at") or bool(g.needs_at(step))) for _, g in self.guards
        )

    def wants(self, stat: str) -> bool:
        """Whether any guard lists ``stat`` (one of ``OPTIONAL_STATS``) in its ``needs``: only then is it measured."""
        return any(stat in getattr(g, "needs", ()) for _, g in self.guards)

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        verdicts = []
        for name, guard in self.guards:
            if not self._sees(guard, stage):
                continue
            v = guard.observe(stage, stats, step)
            if v is None:
                v = Verdict.proceed()
            verdicts.append((name, v))
            if v.action != "proceed":
                self._record(step, stage, name, v)
        _, verdict = combine(verdicts)
        sinces = [v.since for _, v in verdicts if v.action == "rollback" and v.since is not None]
        if verdict.action == "rollback" and sinces and min(sinces) != verdict.since:
            verdict = dataclasses.replace(verdict, since=min(sinces))  # the earliest suspicion wins
        merged = merge_adjustments([v for _, v in verdicts if v.action == "adjust"])
        if merged and merged != verdict.adjustments:
            verdict = dataclasses.replace(verdict, adjustments=merged)
        return verdict

    def _record(self, step: int, stage: str, name: str, v: Verdict) -> None:
        key = f"guard/{name}/{v.action}"
        self.counts[key] = self.counts.get(key, 0.0) + 1.0
        if self.events_path is None:
            return
        event = {
            "step": step,
            "stage": stage,
            "guard": name,
            "action": v.action,
            "reason": v.reason,
            "signal": _jsonable(v.signal),
            "threshold": _jsonable(v.threshold),
        }
        if v.action == "scale":
            event["scale"] = v.scale
        if v.adjustments:
            event["adjustments"] = v.adjustments
        if v.since is not None:
            event["since"] = v.since
        self.events_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps(event) + "\n")

    def pop_metrics(self) -> dict[str, float]:
        out, self.counts = self.counts, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {name: guard.state_dict() for name, guard in self.guards}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, guard in self.guards:
            if name in state:
                guard.load_state_dict(state[name])


def _jsonable(x: float | None) -> float | str | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else str(x)  # JSON has no NaN/Inf
