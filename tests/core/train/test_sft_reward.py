"""``armor sft --val-reward DOMAIN``: held-out accuracy is the share of greedy responses a reward domain
scores 1 (with ``--val-reward-kwarg`` parameters), not exact match; wired through the command."""

from __future__ import annotations

import argparse
import json

import pytest

from armor_core import RewardDomain, hookimpl
from armor_core.cli.sft import add_parser
from armor_core.plugins import PluginManager
from armor_core.train.sft_reward import reward_passed

pytestmark = pytest.mark.usefixtures("one_thread")


def within(prompt, response, ground_truth, extra, *, tol=0):
    try:
        return float(abs(int(response.strip()) - int(ground_truth)) <= tol)
    except ValueError:
        return 0.0


def always(prompt, response, ground_truth, extra):
    return 1.0


class _Plugin:
    @hookimpl
    def armor_register_reward_domains(self, register):
        register("within", RewardDomain(within, requires_ground_truth=True, inline=True))
        register("always", RewardDomain(always, requires_ground_truth=False, inline=True))


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(_Plugin(), name="sft_reward_test_plugin")
    for plugin in ("armor_plugins.tasks.arithmetic",):  # the command's --task
        pm.register(__import__(plugin, fromlist=["_"]), name=plugin)
    monkeypatch.setattr("armor_core.plugins._default", pm)


def test_a_response_passes_when_the_domain_scores_it_1_with_the_given_parameters():
    rows = [{"prompt": "2+2=", "ground_truth": "4"}, {"prompt": "3+3=", "ground_truth": "6"}]
    with reward_passed("within", ["tol=1"]) as passed:
        assert passed(rows, ["5", "8"]) == [True, False]  # 5 is within 1 of 4: not exact, but it passes
    with reward_passed("within", []) as passed:
        assert passed(rows, ["5", "6"]) == [False, True]
    with pytest.raises(ValueError, match="'tol' is not KEY=VALUE"):
        with reward_passed("within", ["tol"]):
            pass
    with pytest.raises(Exception, match="nope"):  # an unknown domain fails before any training
        with reward_passed("nope"):
            pass


def test_the_command_measures_held_out_accuracy_with_the_domain(tmp_path):
    parser = argparse.ArgumentParser(prog="armor")
    add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "m"
    common = ["sft", "--init", "tiny-qwen2", "--task-kwarg", "digits=1", "--train-size", "32", "--val-size", "8"]
    args = parser.parse_args(
        [*common, "--out", str(out), "--steps", "5", "--eval-every", "1", "--stop-at-accuracy", "0.5"]
        + ["--val-reward", "always", "--batch-size", "8"]
    )
    assert args.func(args) == 0
    record = json.loads((out / "armor_sft.json").read_text())
    # an untrained model's greedy answers are not the sums, yet the domain passes them all: the stop rule fired
    assert record["steps"] == 1 and record["val_accuracy"] == 1.0
    assert record["args"]["val_reward"] == "always"
