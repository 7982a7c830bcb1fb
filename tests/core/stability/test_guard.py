"""The guard runner: the most severe verdict wins, events are written, state round-trips."""

from __future__ import annotations

import json

from armor_core import Verdict, hookimpl
from armor_core.stability.guard import GuardRunner, combine
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
    import pytest

    from armor_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"guard.guards\[1\] \(grad_spike\)"):
        GuardRunner([{"name": "non_finite"}, {"name": "grad_spike", "params": {"windw": 3}}])
