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


def test_jsonl_resume_drops_the_rows_of_steps_that_are_trained_again(tmp_path):
    tracker = JsonlTracker(tmp_path)
    for step in range(0, 6):
        tracker.log({"a": float(step)}, step)
    tracker.close()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "a": ')  # killed mid-row
    tracker = JsonlTracker(tmp_path)  # the resumed run, from the checkpoint of step 3
    tracker.resume(3)
    tracker.log({"a": 40.0}, 4)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["a"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_tensorboard_resume_hides_the_earlier_run_s_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path)
    for step in range(1, 6):
        tracker.log({"loss": float(step)}, step)
    tracker.close()
    tracker = TensorBoardTracker(tmp_path)
    tracker.resume(3)
    tracker.log({"loss": 40.0}, 4)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
