"""StabilityGuard: runs the configured guard plugins on each stage's statistics and combines verdicts.

Guards are plugins (``armor_register_stability_guards``); the config lists them in order
(``guard.guards: [{name, params}]``). For each stage of a step the trainer (or, for the ``grad``
stage, each actor worker) calls ``GuardRunner.observe(stage, stats, step)``; every guard sees the
stats and returns a :class:`~armor_core.interfaces.Verdict`, and the most severe one wins
(rollback > skip > scale > adjust > proceed). Guards see only scalar statistics that are already
reduced across data-parallel ranks, so every rank reaches the same verdict without a message.

Every verdict other than ``proceed`` is appended to ``guard_events.jsonl`` in the run directory and
counted in the step's metrics (``guard/<guard>/<action>``). Only verdicts the stage can carry out get there
(``GUARD_STAGES[stage].honours``): a guard whose ``actions`` declare another is refused when it is built
(``build_guards``), and a verdict with another stops the run (``GuardVerdictError``, ``verdict_problem``)
before anything of that stage is recorded.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from armor_core.errors import ConfigError, GuardVerdictError
from armor_core.interfaces import (
    ADJUSTABLE_COEFFICIENTS,
    GUARD_STAGES,
    OPTIONAL_STATS,
    StabilityGuard,
    Verdict,
    capability,
)

if TYPE_CHECKING:
    from armor_core.plugins import PluginManager

__all__ = [
    "GuardRunner",
    "SEVERITY",
    "build_guards",
    "combine",
    "declaration_problem",
    "may_roll_back",
    "merge_adjustments",
    "run_coefficients",
    "sees",
    "verdict_problem",
]

SEVERITY = {"proceed": 0, "adjust": 1, "scale": 2, "skip": 3, "rollback": 4}

#: stages a guard must ask for by name (in its ``stages`` attribute): each costs something extra
OPT_IN_STAGES = frozenset({"step"})

#: the stages the driver runs, where a ``rollback`` restores a checkpoint or rollback point; at ``grad`` and ``step``
#: a worker can only skip (``GUARD_STAGES[stage].honours``)
RESTORING_STAGES = ("reward", "advantage", "update", "validation")


#: when two guards adjust the same coefficient, the more cautious value wins
_CAUTIOUS = {"lr": min, "clip_ratio_low": min, "clip_ratio_high": min, "kl_loss_coef": max, "entropy_coeff": max}
assert set(_CAUTIOUS) == set(ADJUSTABLE_COEFFICIENTS), "every adjustable coefficient needs a cautious merge rule"


def sees(guard: StabilityGuard, stage: str) -> bool:
    """Whether ``guard`` is shown ``stage``: those in its ``stages``, else every stage but the opt-in ones."""
    stages = capability("stability_guard", guard, "stages")
    return stage in stages if stages is not None else stage not in OPT_IN_STAGES


def _wants_step(guard: StabilityGuard, step: int) -> bool:
    """Whether ``guard`` wants its costly stages at ``step``: its ``needs_at(step)``, else always."""
    needs_at = capability("stability_guard", guard, "needs_at")
    return needs_at is None or bool(needs_at(step))


def may_roll_back(guard: StabilityGuard) -> bool:
    """Whether ``guard`` may ask for a rollback the driver carries out: its ``actions`` list ``rollback`` at a
    ``RESTORING_STAGES`` stage it sees, or it declares no ``actions`` (it may return anything) and sees one."""
    actions = capability("stability_guard", guard, "actions")
    stages = [s for s in RESTORING_STAGES if sees(guard, s)]
    if actions is None:
        return bool(stages)
    return any("rollback" in ((a,) if isinstance(a := actions.get(s, ()), str) else a) for s in stages)


def _where_honoured(action: str) -> str:
    return ", ".join(s for s, spec in GUARD_STAGES.items() if spec.honoured(action)) or "no stage"


def _honoured_at(stage: str) -> str:
    return ", ".join(["proceed", *GUARD_STAGES[stage].honours])


def declaration_problem(guard: StabilityGuard) -> str | None:
    """What is wrong with ``guard``'s ``needs`` or ``actions`` (``{stage: (action, ...)}``), or None: every statistic
    it needs must be one a stage it sees measures (``OPTIONAL_STATS``); every stage in ``actions`` one it sees, every
    action one that stage honours (``GUARD_STAGES[stage].honours``)."""
    cls = type(guard).__name__
    for stat in capability(
        "stability_guard", guard, "needs"
    ):  # optional statistics, each measured at one stage the guard must see
        if stat not in OPTIONAL_STATS:
            return f"{cls}.needs {stat!r}, which no stage measures; optional statistics: {list(OPTIONAL_STATS)}"
        if not sees(guard, OPTIONAL_STATS[stat]):
            stage = OPTIONAL_STATS[stat]
            return f"{cls}.needs {stat!r}, measured at stage {stage!r}: list {stage!r} in its `stages`"
    actions = capability("stability_guard", guard, "actions")
    if actions is None:
        return None
    if not isinstance(actions, Mapping):
        return f"{cls}.actions = {actions!r} must map stages to the actions returned there, e.g. {{'grad': ('skip',)}}"
    for stage, listed in actions.items():
        if stage not in GUARD_STAGES:
            return f"{cls}.actions names the stage {stage!r}; the stages are {', '.join(GUARD_STAGES)}"
        if not sees(guard, stage):
            return f"{cls}.actions lists stage {stage!r}, which the guard does not see (add it to {cls}.stages)"
        for action in [listed] if isinstance(listed, str) else listed:
            if not GUARD_STAGES[stage].honoured(action):
                return (
                    f"{cls}.actions declares {action!r} at stage {stage!r}, which that stage cannot honour; it "
                    f"honours {_honoured_at(stage)} ({action!r} is honoured at: {_where_honoured(action)})"
                )
    return None


def verdict_problem(name: str, guard: StabilityGuard, stage: str, verdict: Verdict) -> str | None:
    """Why ``verdict``, returned by the guard labelled ``name`` at ``stage``, cannot be carried out, or None."""
    action = verdict.action
    spec = GUARD_STAGES.get(stage)
    if spec is not None and not spec.honoured(action):
        return (
            f"guard {name} returned {action!r} at stage {stage!r}, which that stage cannot honour (it honours "
            f"{_honoured_at(stage)}); {action!r} is honoured at: {_where_honoured(action)}. Return it at one of "
            f"those stages, or one of {_honoured_at(stage)} here (interfaces.GUARD_STAGES[{stage!r}].honours)"
        )
    declared = capability("stability_guard", guard, "actions")
    if action != "proceed" and isinstance(declared, Mapping):
        listed = declared.get(stage, ())
        listed = (listed,) if isinstance(listed, str) else tuple(listed)
        if action not in listed:
            return (
                f"guard {name} returned {action!r} at stage {stage!r}, but {type(guard).__name__}.actions declares "
                f"{', '.join(listed) or 'only proceed'} there: declare what the guard returns"
            )
    return None


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
    specs: list[Mapping[str, Any]], pm: PluginManager | None = None, run_values: Mapping[str, float] | None = None
) -> list[tuple[str, StabilityGuard]]:
    """Each configured guard, built: ``[(label, instance)]`` in the config's order.

    A constructor parameter named after an adjustable coefficient (``lr``, ``kl_loss_coef``, ``entropy_coeff``,
    ``clip_ratio_low``, ``clip_ratio_high``) that the guard's ``params`` do not set is filled with the run's value
    from ``run_values``, so a guard that lowers a coefficient and later restores it restores the run's own.
    The label is the guard's name, or ``name#i`` (its position) when the name is listed more than once, so two
    instances keep their state, events and counts apart.

    :raises ConfigError: naming ``guard.guards[i]``, for an unknown guard, a parameter its constructor refuses, or
        ``actions`` that declare a verdict a stage it sees cannot honour (``declaration_problem``); ``armor run``
        builds them once this way before any worker starts (``loop.preflight``).
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
        if problem := declaration_problem(guard):
            raise ConfigError(f"guard.guards[{i}] ({spec['name']}): {problem}")
        built.append((spec["name"] if names.count(spec["name"]) == 1 else f"{spec['name']}#{i}", guard))
    return built


class GuardRunner:
    """Holds the guard instances of one process.

    :param guards: ``[{name, params}]`` from ``guard.guards``.
    :param run_dir: where ``guard_events.jsonl`` goes (None: events are only counted).
    :param run_values: the run's adjustable coefficients (``run_coefficients(cfg.actor)``), see ``build_guards``.
    """

    def __init__(
        self,
        guards: list[Mapping[str, Any]],
        pm: PluginManager | None = None,
        run_dir: str | Path | None = None,
        enable: bool = True,
        run_values: Mapping[str, float] | None = None,
    ) -> None:
        self.enable = enable
        self.guards: list[tuple[str, Any]] = build_guards(guards, pm, run_values) if enable else []
        self.events_path = Path(run_dir) / "guard_events.jsonl" if run_dir else None
        self.counts: dict[str, float] = {}

    def watches(self, stage: str) -> bool:
        """Whether any guard observes ``stage`` (the worker measures ``step`` stats only then)."""
        return any(sees(g, stage) for _, g in self.guards)

    def watches_at(self, stage: str, step: int) -> bool:
        """Whether a guard observing ``stage`` wants it at ``step``: one without ``needs_at`` always does, one with
        it when ``needs_at(step)`` says so (a costly stage is measured only then)."""
        return any(sees(g, stage) and _wants_step(g, step) for _, g in self.guards)

    def rolls_back(self) -> bool:
        """Whether any guard may ask for a rollback the driver carries out (``may_roll_back``): the trainer keeps
        rollback points only then."""
        return any(may_roll_back(g) for _, g in self.guards)

    def wants(self, stat: str) -> bool:
        """Whether any guard lists ``stat`` in its ``needs`` (a statistic a stage measures only on request, such as
        ``policy_kl`` at ``step``: ``GUARD_STAGES[stage].optional``): the worker measures it only then."""
        return any(stat in capability("stability_guard", g, "needs") for _, g in self.guards)

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        """The combined verdict of the guards that see ``stage``, each non-``proceed`` one recorded.

        :raises GuardVerdictError: a guard returned a verdict ``stage`` cannot honour (``verdict_problem``);
            nothing of this stage is recorded then.
        """
        verdicts = []
        for name, guard in self.guards:
            if sees(guard, stage):
                v = guard.observe(stage, stats, step)
                verdicts.append((name, guard, Verdict.proceed() if v is None else v))
        for name, guard, v in verdicts:
            if problem := verdict_problem(name, guard, stage, v):
                raise GuardVerdictError(f"step {step}: {problem}")
        acted = [(name, v) for name, _, v in verdicts if v.action != "proceed"]
        for name, v in acted:
            self._record(step, stage, name, v)
        _, verdict = combine(acted)
        sinces = [v.since for _, v in acted if v.action == "rollback" and v.since is not None]
        if verdict.action == "rollback" and sinces and min(sinces) != verdict.since:
            verdict = dataclasses.replace(verdict, since=min(sinces))  # the earliest suspicion wins
        # every recorded verdict's adjustments, whatever its action (a skip that also lowers the lr)
        merged = merge_adjustments([v for _, v in acted])
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

    def record_stop(self, step: int, stage: str, name: str, reason: str) -> None:
        """An event that stops the run without a verdict (a weight sync the rollout engine did not take, ``name``
        ``weight_sync``): appended to ``guard_events.jsonl`` as action ``stop``, so the run's events and
        ``armor report`` show why it ended."""
        self.counts[f"guard/{name}/stop"] = self.counts.get(f"guard/{name}/stop", 0.0) + 1.0
        if self.events_path is None:
            return
        event = {"step": step, "stage": stage, "guard": name, "action": "stop", "reason": reason}
        self.events_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps(event) + "\n")

    def open_events(self) -> None:
        """Create ``guard_events.jsonl`` if it is missing, so every run directory has it (empty while no guard has
        acted); an existing one, a resumed run's, is kept as it is (opened for appending, never truncated)."""
        if self.events_path is not None:
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            open(self.events_path, "a").close()

    def forget_after(self, step: int) -> None:
        """Drop the events of steps after ``step`` from ``guard_events.jsonl`` (a resume from that step's checkpoint
        takes those steps, and their verdicts, again); a line that does not parse (a killed run's last) goes too."""
        if self.events_path is None or not self.events_path.exists():
            return
        kept = []
        for line in self.events_path.read_text().splitlines():
            try:
                event_step = json.loads(line)["step"]
            except (ValueError, TypeError, KeyError):
                continue
            if isinstance(event_step, int) and event_step <= step:
                kept.append(line + "\n")
        tmp = self.events_path.with_name(self.events_path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.events_path)  # the old file or the new one, never half of one

    def adjusted(self, adjustments: Mapping[str, float]) -> None:
        """Tell the guards with an ``adjusted`` capability of coefficients changed by a verdict they did not return
        (in an actor worker: one of a driver stage, sent with ``ActorAPI.apply_adjustments``)."""
        for _, guard in self.guards:
            if (told := capability("stability_guard", guard, "adjusted")) is not None:
                told(dict(adjustments))

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
