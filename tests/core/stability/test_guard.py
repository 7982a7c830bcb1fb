"""The guard runner: the most severe verdict wins, events are written, state round-trips."""

from __future__ import annotations

import json

import pytest

from armor_core import Verdict, hookimpl
from armor_core.errors import ConfigError, GuardVerdictError
from armor_core.interfaces import GUARD_STAGES
from armor_core.stability.guard import RESTORING_STAGES, GuardRunner, combine
from armor_core.testing import registered


def test_combine_takes_the_most_severe():
    name, v = combine([("a", Verdict("adjust")), ("b", Verdict("skip", "x")), ("c", Verdict("scale", scale=0.5))])
    assert (name, v.action) == ("b", "skip")
    assert combine([])[1].action == "proceed"


def test_non_finite_guard_skips_then_rolls_back(tmp_path):
    runner = GuardRunner([{"name": "non_finite", "params": {"max_consecutive": 2}}], run_dir=tmp_path)
    assert runner.observe("reward", {"score/mean": 0.5}, 1).action == "proceed"
    assert runner.observe("grad", {"grad_norm": float("nan")}, 2).action == "skip"
    assert runner.observe("grad", {"grad_norm": float("inf")}, 3).action == "rollback"
    events = [json.loads(line) for line in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["guard"], e["action"], e["signal"]) for e in events] == [
        (2, "non_finite", "skip", 1.0),
        (3, "non_finite", "rollback", 2.0),
    ]
    assert "grad_norm" in events[0]["reason"]
    assert runner.pop_metrics() == {"guard/non_finite/skip": 1.0, "guard/non_finite/rollback": 1.0}
    state = runner.state_dict()
    fresh = GuardRunner([{"name": "non_finite", "params": {"max_consecutive": 2}}])
    fresh.load_state_dict(state)
    assert fresh.observe("grad", {"grad_norm": float("nan")}, 4).action == "rollback"


def test_a_clean_step_resets_the_count():
    runner = GuardRunner([{"name": "non_finite", "params": {"max_consecutive": 2}}])
    assert runner.observe("grad", {"grad_norm": float("nan")}, 1).action == "skip"
    assert runner.observe("update", {"actor/pg_loss": 0.1}, 2).action == "proceed"
    assert runner.observe("grad", {"grad_norm": float("nan")}, 3).action == "skip"


class Halver:
    @hookimpl
    def armor_register_stability_guards(self, register):
        class HalveBigGrads:
            def __init__(self, limit=1.0):
                self.limit = limit

            def observe(self, stage, stats, step):
                g = stats.get("grad_norm", 0.0)
                return Verdict("scale", "big", g, self.limit, scale=0.5) if g > self.limit else Verdict()

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass

        register("halver", HalveBigGrads)


def test_custom_guard_plugin_runs_in_order_with_builtins():
    with registered(Halver()):
        runner = GuardRunner([{"name": "halver", "params": {"limit": 2.0}}, {"name": "non_finite"}])
        v = runner.observe("grad", {"grad_norm": 3.0}, 1)
        assert (v.action, v.scale) == ("scale", 0.5)
        assert (
            runner.observe("grad", {"grad_norm": float("nan")}, 2).action == "skip"
        )  # nan > 2 is False; non_finite catches it


def test_adjustments_of_all_guards_are_merged_cautiously():
    class Adjusters:
        @hookimpl
        def armor_register_stability_guards(self, register):
            def make(adj):
                class G:
                    def __init__(self):
                        pass

                    def observe(self, stage, stats, step):
                        return Verdict("adjust", "x", adjustments=dict(adj))

                    def state_dict(self):
                        return {}

                    def load_state_dict(self, state):
                        pass

                return G

            register("lower_lr", make({"lr": 1e-5, "kl_loss_coef": 0.01}))
            register("lower_lr_more", make({"lr": 5e-6, "kl_loss_coef": 0.002, "clip_ratio_high": 0.1}))

    with registered(Adjusters()):
        runner = GuardRunner([{"name": "lower_lr"}, {"name": "lower_lr_more"}])
        v = runner.observe("update", {}, 1)
    assert v.action == "adjust"
    assert v.adjustments == {"lr": 5e-6, "kl_loss_coef": 0.01, "clip_ratio_high": 0.1}


def test_a_guard_is_given_the_runs_coefficients_unless_its_params_set_them():
    runner = GuardRunner([{"name": "kl"}], run_values={"lr": 5e-5, "kl_loss_coef": 0.01, "entropy_coeff": 0.0})
    knobs = runner.guards[0][1].knobs
    # what the guard lowers and later restores is the run's actor.lr, not the guard's own default (3e-5)
    assert (knobs["lr"].hi, knobs["kl_loss_coef"].value) == (5e-5, 0.01)
    runner = GuardRunner([{"name": "kl", "params": {"lr": 1e-5}}], run_values={"lr": 5e-5})
    assert runner.guards[0][1].knobs["lr"].hi == 1e-5


def test_two_instances_of_one_guard_keep_their_state_apart():
    specs = [{"name": "non_finite", "params": {"max_consecutive": 2}}, {"name": "non_finite"}]
    runner = GuardRunner(specs)
    assert [label for label, _ in runner.guards] == ["non_finite#0", "non_finite#1"]
    state = runner.state_dict()
    assert set(state) == {"non_finite#0", "non_finite#1"}
    runner.observe("grad", {"grad_norm": float("nan")}, 1)
    fresh = GuardRunner(specs)
    fresh.load_state_dict(runner.state_dict())
    assert fresh.state_dict() == runner.state_dict()
    assert fresh.pop_metrics() == {} and runner.pop_metrics() == {
        "guard/non_finite#0/skip": 1.0,
        "guard/non_finite#1/skip": 1.0,
    }


def test_a_guard_parameter_its_constructor_refuses_is_one_config_error():
    with pytest.raises(ConfigError, match=r"guard.guards\[1\] \(grad_spike\)"):
        GuardRunner([{"name": "non_finite"}, {"name": "grad_spike", "params": {"windw": 3}}])


def test_after_the_update_non_finite_counts_the_streak_and_asks_only_for_a_rollback(tmp_path):
    """A skip at ``update`` or ``validation`` could not be carried out: the guard says nothing there until
    the streak is complete, and then asks for the rollback the driver can make."""
    runner = GuardRunner([{"name": "non_finite", "params": {"max_consecutive": 2}}], run_dir=tmp_path)
    nan = float("nan")
    assert runner.observe("grad", {"grad_norm": nan}, 1).action == "skip"
    assert runner.observe("update", {"actor/grad_norm": nan}, 1).action == "proceed"  # the echo of step 1's NaN
    assert runner.observe("validation", {"val/acc_greedy": nan}, 2).action == "rollback"  # step 2: two in a row
    assert runner.observe("update", {"actor/entropy": nan}, 3).action == "rollback"
    events = [json.loads(line) for line in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["stage"], e["action"]) for e in events] == [
        (1, "grad", "skip"),
        (2, "validation", "rollback"),
        (3, "update", "rollback"),
    ]


def _registering(**guards):
    class Plugins:
        @hookimpl
        def armor_register_stability_guards(self, register):
            for name, cls in guards.items():
                register(name, cls)

    return registered(Plugins())


def _guard(decide, **attrs):
    """A guard class whose ``observe`` is ``decide(stage, stats)``, with class attributes ``attrs``."""

    class G:
        def observe(self, stage, stats, step):
            return decide(stage, stats)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    for k, v in attrs.items():
        setattr(G, k, v)
    return G


def test_a_guard_declaring_a_verdict_its_stage_cannot_honour_is_refused_when_built():
    late_skip = _guard(lambda stage, stats: Verdict(), actions={"update": ("skip",)})
    blind = _guard(lambda stage, stats: Verdict(), stages=("grad",), actions={"step": ("skip",)})
    honest = _guard(lambda stage, stats: Verdict(), actions={"grad": ("skip", "scale"), "update": ("rollback",)})
    with _registering(late_skip=late_skip, blind=blind, honest=honest):
        GuardRunner([{"name": "non_finite"}, {"name": "honest"}])
        with pytest.raises(ConfigError) as e:
            GuardRunner([{"name": "non_finite"}, {"name": "late_skip"}])
        assert str(e.value) == (
            "guard.guards[1] (late_skip): G.actions declares 'skip' at stage 'update', which that stage cannot honour; "
            "it honours proceed, rollback, adjust ('skip' is honoured at: reward, advantage, grad, step)"
        )
        with pytest.raises(ConfigError, match=r"guard.guards\[0\] \(blind\): G.actions lists stage 'step', which"):
            GuardRunner([{"name": "blind"}])


def test_a_verdict_its_stage_cannot_honour_stops_the_run_and_is_not_logged(tmp_path):
    skip_always = _guard(lambda stage, stats: Verdict("skip", "late"))
    with _registering(skip_always=skip_always):
        runner = GuardRunner([{"name": "non_finite"}, {"name": "skip_always"}], run_dir=tmp_path)
        assert runner.observe("advantage", {"score/mean": float("nan")}, 1).action == "skip"  # honoured there
        with pytest.raises(GuardVerdictError) as e:
            runner.observe("update", {"actor/entropy": float("nan")}, 2)
    assert str(e.value).startswith(
        "step 2: guard skip_always returned 'skip' at stage 'update', which that stage cannot honour (it honours "
        "proceed, rollback, adjust); 'skip' is honoured at: reward, advantage, grad, step."
    )
    events = [json.loads(line) for line in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["guard"]) for e in events] == [(1, "non_finite"), (1, "skip_always")]  # nothing of step 2
    assert runner.pop_metrics() == {"guard/non_finite/skip": 1.0, "guard/skip_always/skip": 1.0}


@pytest.mark.parametrize("stage", ["reward", "advantage", "step", "update", "validation"])
def test_scale_is_honoured_only_at_grad(stage):
    scaler = _guard(lambda stage, stats: Verdict("scale", scale=0.5), stages=tuple(["grad", stage]))
    with _registering(scaler=scaler):
        runner = GuardRunner([{"name": "scaler"}])
        assert runner.observe("grad", {}, 1).scale == 0.5
        with pytest.raises(GuardVerdictError, match=f"'scale' at stage '{stage}'.*honoured at: grad\\."):
            runner.observe(stage, {}, 1)


def test_a_verdict_the_guard_did_not_declare_is_refused():
    def decide(stage, stats):
        return Verdict("rollback") if stage == "update" else Verdict()

    sneaky = _guard(decide, actions={"update": ("adjust",)})
    with _registering(sneaky=sneaky):
        runner = GuardRunner([{"name": "sneaky"}])
        assert runner.observe("reward", {}, 1).action == "proceed"
        with pytest.raises(
            GuardVerdictError, match="guard sneaky returned 'rollback' at stage 'update', but G.actions"
        ):
            runner.observe("update", {}, 1)  # a rollback is honoured there, but the guard said it returns no such thing


def test_the_adjustments_riding_on_a_skip_are_merged_with_the_others():
    undo = _guard(lambda stage, stats: Verdict("skip", adjustments={"lr": 1e-6}), stages=("step",))
    lower = _guard(
        lambda stage, stats: Verdict("adjust", adjustments={"lr": 5e-6, "kl_loss_coef": 0.1}), stages=("step",)
    )
    with _registering(undo=undo, lower=lower):
        v = GuardRunner([{"name": "lower"}, {"name": "undo"}]).observe("step", {}, 1)
    assert (v.action, v.adjustments) == ("skip", {"lr": 1e-6, "kl_loss_coef": 0.1})  # the lower lr, and both keys


def test_the_run_keeps_rollback_points_only_for_a_guard_that_may_ask_the_driver_for_a_rollback():
    """``rolls_back`` decides whether the trainer pays for rollback points: a rollback at ``grad`` or ``step`` is a
    worker's skip and restores nothing; a guard that declares no ``actions`` may return anything."""
    undeclared = _guard(lambda stage, stats: Verdict())
    worker_only = _guard(lambda stage, stats: Verdict(), stages=("grad", "step"), actions={"grad": ("rollback",)})
    at_validation = _guard(lambda stage, stats: Verdict(), actions={"validation": "rollback"})
    with _registering(undeclared=undeclared, worker_only=worker_only, at_validation=at_validation):
        assert GuardRunner([{"name": "non_finite"}, {"name": "trust_region"}]).rolls_back()  # the default stack
        assert not GuardRunner([{"name": "grad_spike"}, {"name": "entropy"}]).rolls_back()
        assert not GuardRunner([{"name": "worker_only"}]).rolls_back()
        assert GuardRunner([{"name": "undeclared"}]).rolls_back()
        assert GuardRunner([{"name": "at_validation"}]).rolls_back()  # one action given as a string
        assert not GuardRunner([{"name": "non_finite"}], enable=False).rolls_back()
    # the driver's stages are the ones where a rollback restores
    assert set(RESTORING_STAGES) == {s for s, spec in GUARD_STAGES.items() if spec.where.startswith("driver")}


def test_a_guard_needing_a_statistic_no_stage_measures_or_of_a_stage_it_does_not_watch_is_refused():
    class NeedsNothingReal:
        stages = ("step",)
        needs = ("policy_entropy",)

        def observe(self, stage, stats, step):
            return Verdict.proceed()

    class NeedsWithoutTheStage(NeedsNothingReal):
        stages = ("update",)
        needs = ("policy_kl",)

    class Plugin:
        @hookimpl
        def armor_register_stability_guards(self, register):
            register("needs_nothing_real", NeedsNothingReal)
            register("needs_without_the_stage", NeedsWithoutTheStage)

    with registered(Plugin(), load_entrypoints=False) as pm:
        with pytest.raises(
            ConfigError,
            match=r"guard.guards\[0\] \(needs_nothing_real\): NeedsNothingReal.needs 'policy_entropy', which no stage",
        ):
            GuardRunner([{"name": "needs_nothing_real"}], pm=pm)
        with pytest.raises(
            ConfigError,
            match=r"NeedsWithoutTheStage.needs 'policy_kl', measured at stage 'step': list 'step' in its `stages`",
        ):
            GuardRunner([{"name": "needs_without_the_stage"}], pm=pm)


def test_a_resume_drops_the_events_of_the_steps_it_takes_again(tmp_path):
    runner = GuardRunner([{"name": "non_finite"}], run_dir=tmp_path)
    for step in (1, 2, 3):
        runner.observe("grad", {"grad_norm": float("nan"), "pg_loss": 0.1}, step)
    with open(tmp_path / "guard_events.jsonl", "a") as fh:
        fh.write('{"step": 4, "stage": "gr')  # the half-written line of a killed run
    runner.forget_after(2)
    kept = [json.loads(x) for x in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in kept] == [1, 2]


def test_the_events_file_is_there_from_the_start_and_a_resume_keeps_it(tmp_path):
    runner = GuardRunner([{"name": "non_finite"}], run_dir=tmp_path / "run")
    runner.open_events()  # a run's start: no guard acted yet, the file the docs list is there, empty
    assert (tmp_path / "run" / "guard_events.jsonl").read_text() == ""
    runner.observe("grad", {"grad_norm": float("nan")}, 1)
    resumed = GuardRunner([{"name": "non_finite"}], run_dir=tmp_path / "run")
    resumed.forget_after(1)
    resumed.open_events()  # opening again never truncates what earlier steps wrote
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "guard_events.jsonl").read_text().splitlines()] == [1]
    GuardRunner([{"name": "non_finite"}]).open_events()  # no run directory: nothing to open
