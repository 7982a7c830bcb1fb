"""Trackers get the config as written: a ``${oc.env:...}`` value is logged as the text, not the secret."""

from __future__ import annotations

import dataclasses

from armor_core.config.schema import load_config
from armor_core.config.written import for_trackers


def test_interpolated_values_reach_trackers_as_written_and_the_run_gets_them_resolved(monkeypatch):
    monkeypatch.setenv("ARMOR_TEST_SECRET", "hunter2")
    cfg = load_config(
        None,
        [
            "trainer.experiment_name=${oc.env:ARMOR_TEST_SECRET}",
            "trainer.project_name=p-${trainer.experiment_name}",  # a secret reached through another key
            "guard.guards=[{name: grad_spike, params: {window: 3, note: '${oc.env:ARMOR_TEST_SECRET}'}}]",
        ],
    )
    logged = for_trackers(cfg)
    assert "hunter2" not in repr(dataclasses.asdict(logged))
    assert logged.trainer.experiment_name == "${oc.env:ARMOR_TEST_SECRET}"
    assert logged.trainer.project_name == "p-${trainer.experiment_name}"
    assert logged.guard.guards[0]["params"] == {"window": 3, "note": "${oc.env:ARMOR_TEST_SECRET}"}
    # the run itself uses the resolved values, and the rest of the config is the same object's values
    assert (cfg.trainer.experiment_name, cfg.trainer.project_name) == ("hunter2", "p-hunter2")
    assert dataclasses.replace(logged.trainer, experiment_name="x", project_name="y") == dataclasses.replace(
        cfg.trainer, experiment_name="x", project_name="y"
    )


def test_a_config_without_interpolations_is_handed_over_as_is():
    cfg = load_config(None, ["actor.lr=2e-5"])
    assert for_trackers(cfg) is cfg
