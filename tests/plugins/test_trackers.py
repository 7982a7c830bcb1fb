"""The built-in metric trackers write what they were given, readable by the usual tools."""

import json
import math

from armor_plugins.trackers import ConsoleTracker, JsonlTracker, TensorBoardTracker


def test_tensorboard_reads_back_every_scalar_of_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path)
    tracker.log({"actor/pg_loss": 0.5, "critic/score/mean": 0.25, "actor/kl": float("nan")}, 1)
    tracker.log({"actor/pg_loss": -0.125, "val/acc_greedy": 0.75}, 2)
    tracker.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["actor/kl", "actor/pg_loss", "critic/score/mean", "val/acc_greedy"]
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, 0.5), (2, -0.125)]
    assert [(e.step, e.value) for e in events.Scalars("val/acc_greedy")] == [(2, 0.75)]
    assert math.isnan(events.Scalars("actor/kl")[0].value)


def test_jsonl_writes_one_row_a_step_with_non_finite_values_as_strings(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log({"a": 1.0, "b": float("inf")}, 3)
    tracker.close()
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [{"step": 3, "a": 1.0, "b": "inf"}]


def test_console_line_is_written_verbatim_when_not_a_terminal(tmp_path, capsys):
    tracker = ConsoleTracker(tmp_path)
    tracker.log({"critic/score/mean": 0.5, "timing_s/step": 0.125}, 7)
    tracker.close()
    assert capsys.readouterr().out == "step 7  score 0.5  s/step 0.125\n"
