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
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 3, "a": 1.0, "b": "inf"}
    ]


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


# -- wandb and mlflow, against the real libraries ----------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from armor_core.config.plugin_checks import validate_plugins  # noqa: E402
from armor_core.config.schema import ConfigError, load_config  # noqa: E402 (after the module-level skip check)


@pytest.fixture
def no_wandb_credentials(monkeypatch, tmp_path):
    """No API key anywhere wandb looks: environment, settings files, .netrc."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def _wandb_inspect(path, *flags):
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *flags, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return json.loads(out) if "--summary" in flags else [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow  # wandb starts its service process
@pytest.mark.usefixtures("no_wandb_credentials")
def test_wandb_without_a_key_logs_offline_config_metrics_and_summary(tmp_path):
    from armor_plugins.trackers.wandb_tracker import WandbTracker

    run_dir = tmp_path / "grpo-run"
    cfg = load_config(None, [f"trainer.run_dir={run_dir}", "trainer.project_name=armor-test", "actor.lr=3e-5"])
    tracker = WandbTracker(run_dir, cfg)
    tracker.log({"critic/score/mean": 0.25, "actor/kl": float("nan")}, 1)
    tracker.log({"critic/score/mean": 0.75}, 2)
    tracker.summary({"steps": 2, "val_after": {"val/acc_greedy": 0.5}})
    tracker.close()

    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1  # offline: nothing was sent, `wandb sync` uploads it later
    run = _wandb_inspect(offline[0], "--summary")
    assert (run["project"], run["name"], run["state"]) == ("armor-test", "grpo-run", "finished")
    assert run["config"]["actor"]["lr"] == 3e-5 and run["config"]["trainer"]["run_dir"] == str(run_dir)
    assert run["summary"]["steps"] == 2 and run["summary"]["val_after"] == {"val/acc_greedy": 0.5}
    rows = [r["history"]["item"] for r in _wandb_inspect(offline[0]) if r["type"] == "history"]
    assert [(r["_step"], r["critic/score/mean"]) for r in rows] == [(1, 0.25), (2, 0.75)]
    assert rows[0]["actor/kl"] == "NaN"


@pytest.mark.slow  # wandb starts its service process
@pytest.mark.usefixtures("no_wandb_credentials")
def test_wandb_resume_is_a_new_run_in_the_same_group_that_records_the_step(tmp_path):
    from armor_plugins.trackers.wandb_tracker import WandbTracker

    tracker = WandbTracker(tmp_path / "r", None)
    tracker.resume(3)
    tracker.log({"loss": 4.0}, 4)
    tracker.close()
    (offline,) = (tmp_path / "r" / "wandb").glob("offline-run-*")
    records = _wandb_inspect(offline)
    assert [r["run"]["run_group"] for r in records if r["type"] == "run"] == ["r"]
    assert [r["history"]["step"]["num"] for r in records if r["type"] == "history"] == [4]
    assert _wandb_inspect(offline, "--summary")["config"] == {"resumed_from_step": 3}


@pytest.mark.usefixtures("no_wandb_credentials")
def test_wandb_goes_online_only_with_credentials_and_obeys_wandb_mode(tmp_path, monkeypatch):
    from armor_plugins.trackers.wandb_tracker import wandb_mode

    assert wandb_mode() == "offline"
    netrc = tmp_path / "wandb.netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'a' * 40}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))  # what `wandb login` writes
    assert wandb_mode() == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "b" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode() is None  # wandb reads WANDB_MODE itself


def _mlflow_runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    return client, experiment, client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_mlflow_logs_params_metrics_and_summary_to_a_file_store_in_the_run_dir(tmp_path, monkeypatch):
    from armor_plugins.trackers.mlflow_tracker import MlflowTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    run_dir = tmp_path / "ppo-run"
    cfg = load_config(None, [f"trainer.run_dir={run_dir}", "actor.lr=3e-5", "data.task_kwargs={digits: 3}"])
    tracker = MlflowTracker(run_dir, cfg)
    tracker.log({"critic/score/mean": 0.25, "val/mean@4": 0.5, "actor/kl": float("inf")}, 1)
    for step in range(2, 40):  # past the batches the tracker lets MLflow's thread hold
        tracker.log({"critic/score/mean": 0.75}, step)
    tracker.summary({"steps": 39, "val_after": {"val/acc_greedy": 0.5}})
    tracker.close()

    client, experiment, (run,) = _mlflow_runs((run_dir / "mlruns").as_uri())
    assert (experiment.name, run.info.run_name, run.info.status) == ("armor", "ppo-run", "FINISHED")
    params = run.data.params
    assert (
        params["actor.lr"] == "3e-05"
        and params["data.task_kwargs.digits"] == "3"
        and params["trainer.run_dir"] == str(run_dir)
    )
    assert params["actor.betas"] == "[0.9, 0.999]"
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "critic/score/mean")]
    assert sorted(history) == [(1, 0.25)] + [(step, 0.75) for step in range(2, 40)]
    assert run.data.metrics["val/mean_4"] == 0.5 and run.data.metrics["actor/kl"] == float("inf")
    summary = json.loads(
        (tmp_path / client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))).read_text()
    )
    assert summary == {"steps": 39, "val_after": {"val/acc_greedy": 0.5}}


def test_mlflow_writes_one_batch_at_a_time_in_step_order_and_raises_a_write_error(tmp_path, monkeypatch):
    """MLflow's own asynchronous logging writes batches from several threads, and its file store then
    fails to create a new metric's directory ("[Errno 17] File exists", seen in CI): the tracker's
    writes must never overlap, must keep their order, and a failed write must reach the driver."""
    import threading
    import time as time_module

    from armor_plugins.trackers.mlflow_tracker import MlflowTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = MlflowTracker(tmp_path / "run", load_config(None, []))
    in_flight, most, steps, lock = [0], [0], [], threading.Lock()

    def log_batch(run_id, metrics=(), params=(), tags=(), synchronous=None):
        assert synchronous is None  # the store is written in the writer's own thread, synchronously
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time_module.sleep(0.002)  # long enough for a second writer to overlap, were there one
        steps.extend(m.step for m in metrics)
        if any(m.step == 70 for m in metrics):
            raise OSError(28, "No space left on device")
        with lock:
            in_flight[0] -= 1

    monkeypatch.setattr(tracker.client, "log_batch", log_batch)
    for step in range(1, 40):
        tracker.log({"critic/score/mean": 0.5, "critic/score/max": 1.0}, step)
    tracker.summary({"steps": 39})
    assert most[0] == 1 and steps == [s for s in range(1, 40) for _ in range(2)]
    with pytest.raises(OSError, match="No space left"):
        for step in range(70, 70 + 40):  # the write error is raised within _MAX_PENDING steps
            tracker.log({"loss": 1.0}, step)
    tracker.close()


def test_mlflow_uses_the_configured_uri_marks_a_crash_failed_and_tags_a_resume(tmp_path):
    from armor_plugins.trackers.mlflow_tracker import MlflowTracker

    store = tmp_path / "team-store"
    cfg = load_config(
        None, [f"trainer.mlflow_tracking_uri={store}", "trainer.project_name=exp", "trainer.experiment_name=first"]
    )
    with pytest.raises(RuntimeError):
        tracker = MlflowTracker(tmp_path / "run", cfg)
        try:
            tracker.log({"loss": 1.0}, 1)
            raise RuntimeError("a worker died")
        finally:
            tracker.close()
    tracker = MlflowTracker(tmp_path / "run", cfg)
    tracker.resume(1)
    tracker.log({"loss": 2.0}, 2)
    tracker.close()
    assert not (tmp_path / "run" / "mlruns").exists()
    _, experiment, runs = _mlflow_runs(store.as_uri())
    assert experiment.name == "exp"
    assert [(r.info.run_name, r.info.status, r.data.tags.get("armor.resumed_from_step")) for r in runs] == [
        ("first", "FAILED", None),
        ("first", "FINISHED", "1"),
    ]


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_choosing_a_tracker_whose_library_is_missing_names_the_extra(monkeypatch, capsys, name):
    from armor_core.cli.main import main

    monkeypatch.setitem(sys.modules, name, None)  # `import wandb` now fails as if it were not installed
    cfg = load_config(None, [f"trainer.loggers=[jsonl,{name}]"])
    with pytest.raises(ConfigError, match=rf"trainer\.loggers\[1\]='{name}': .*pip install 'armor-rl\[{name}\]'"):
        validate_plugins(cfg)
    assert main(["run", f"trainer.loggers=[{name}]", "--print-config"]) == 2
    assert f"pip install 'armor-rl[{name}]'" in capsys.readouterr().err


def test_jsonl_on_a_full_disk_leaves_no_partial_row(tmp_path, monkeypatch):
    import errno
    import os

    import pytest

    tracker = JsonlTracker(tmp_path)
    tracker.log({"a": 1.0}, 1)
    real_write = os.write

    def disk_takes_10_bytes_more(fd, data):  # what a filling disk does: a short write, then ENOSPC
        if len(data) > 10:
            return real_write(fd, data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "write", disk_takes_10_bytes_more)
        with pytest.raises(OSError, match="No space left"):
            tracker.log({"a": 2.0, "b": 3.0}, 2)
    tracker.log({"a": 4.0}, 3)  # space freed: logging goes on after the last whole row
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "a": 1.0}, {"step": 3, "a": 4.0}]


def test_the_trainer_hands_trackers_the_config_as_written_never_a_resolved_secret(tmp_path, monkeypatch):
    """``${oc.env:...}`` values reach a tracker (and so wandb's or MLflow's parameters) as the text written."""
    import dataclasses

    import pytest

    from armor_core import hookimpl
    from armor_core.config.schema import load_config
    from armor_core.engine.isolation import IsolationError
    from armor_core.loop.trainer import Trainer
    from armor_core.testing import registered

    seen = []

    class Capture:
        def __init__(self, run_dir, config):
            seen.append(config)

        def log(self, metrics, step):
            pass

        def close(self):
            pass

    class Plugin:
        @hookimpl
        def armor_register_metric_trackers(self, register):
            register("capture", Capture)

    monkeypatch.setenv("ARMOR_TEST_SECRET", "hunter2")
    cfg = load_config(
        None,
        [
            "trainer.experiment_name=${oc.env:ARMOR_TEST_SECRET}",
            "trainer.loggers=[capture]",
            "engine.cpus_per_worker=4096",  # the trackers exist before the workers start; these never do
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    assert cfg.trainer.experiment_name == "hunter2"
    with registered(Plugin()), pytest.raises(IsolationError):
        Trainer(cfg)
    assert len(seen) == 1 and seen[0].trainer.experiment_name == "${oc.env:ARMOR_TEST_SECRET}"
    assert "hunter2" not in repr(dataclasses.asdict(seen[0]))
