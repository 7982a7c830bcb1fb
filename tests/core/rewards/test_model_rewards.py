"""A classifier reward model: ``armor rm train`` fits one on preference pairs from a hidden rule (the
answer's last digit is even) and ranks held-out pairs; ``reward.model`` scores rows with it in the reward
pool, normalised, beside its rule at weight 0 with the gap logged; bad settings fail at start."""

from __future__ import annotations

import json
import random

import pytest

from armor_core.cli.main import main as armor
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager

EVEN_RULE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    s = solution_str.strip()
    return float(s.isdigit() and int(s[-1]) % 2 == 0)
"""


def _pairs(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(10, 99), rng.randrange(10, 99)
            chosen, rejected = str(rng.randrange(0, 100) * 2), str(rng.randrange(0, 100) * 2 + 1)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": chosen, "rejected": rejected}) + "\n")
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    pairs, held_out = _pairs(tmp / "pairs.jsonl", 400, 0), _pairs(tmp / "held_out.jsonl", 100, 1)
    out = tmp / "rm"
    code = armor(
        ["rm", "train", "--pairs", str(pairs), "--val-pairs", str(held_out), "--model", "builtin:arithmetic-tiny",
         "--out", str(out), "--steps", "40", "--eval-every", "20", "--lr", "3e-4", "--threads", "1"]
    )  # fmt: skip
    assert code == 0
    return out


def test_rm_train_learns_the_hidden_rule_and_records_what_normalize_needs(rm_dir):
    record = json.loads((rm_dir / "armor_rm.json").read_text())
    assert record["val_accuracy"] >= 0.9 > record["val_accuracy_before"]
    assert record["score_std"] > 0 and [h["step"] for h in record["history"]] == [20, 40]
    config = json.loads((rm_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and len(config["id2label"]) == 1


def test_the_reward_model_scores_rows_normalised_and_its_gap_to_the_rule_is_logged(rm_dir, tmp_path):
    rule = tmp_path / "even.py"
    rule.write_text(EVEN_RULE)
    cfg = RewardConfig(
        custom=[{"path": str(rule), "domain": "even", "requires_ground_truth": False}],
        model={"path": str(rm_dir), "data_sources": ["arithmetic"], "rule": "even", "normalize": True},
    )
    responses = ["24", "37", "50", "81"]
    with RewardManager(cfg, PluginManager()) as manager:
        assert manager.domains_for("arithmetic") == {"rm": 1.0, "even": 0.0}
        batch = manager.score(["12+12="] * 4, responses, ["arithmetic"] * 4, [None] * 4)
    rm, raw = batch.sub_scores["rm/score"], batch.sub_scores["rm/raw"]
    assert rm[0] > rm[1] and rm[2] > rm[3] and min(rm[0], rm[2]) > max(rm[1], rm[3])  # even above odd
    stats = json.loads((rm_dir / "armor_rm.json").read_text())
    assert rm.tolist() == pytest.approx([(r - stats["score_mean"]) / stats["score_std"] for r in raw], rel=1e-5)
    assert batch.scores.tolist() == pytest.approx(rm.tolist())  # the rule moves nothing (weight 0)
    assert batch.metrics["reward/even/score"] == 0.5
    assert batch.metrics["reward/model_minus_rule"] == pytest.approx(
        float((rm - batch.sub_scores["even/score"]).mean())
    )


def test_bad_reward_model_settings_fail_at_start(rm_dir, tmp_path):
    for entry, message in [
        ({"path": "builtin:arithmetic-tiny"}, r"Qwen2ForCausalLM, not a sequence-classification model"),
        ({"path": str(tmp_path / "nowhere")}, r"reward.model.path: .*nowhere"),
        ({"path": str(rm_dir), "normalize": {"mean": 0}}, r"normalize=.*expected true, false or \{mean"),
        ({"path": str(rm_dir), "batch_size": 0}, r"batch_size=0: expected a whole number of at least 1"),
        ({"path": str(rm_dir), "colour": 1}, r"unknown key\(s\) colour"),
    ]:
        with pytest.raises(ConfigError, match=message):
            RewardManager(RewardConfig(model=entry), PluginManager())
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in rm_dir.iterdir():
        if f.name != "armor_rm.json":
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ConfigError, match=r"normalize=true needs .*armor_rm.json"):
        RewardManager(RewardConfig(model={"path": str(bare), "normalize": True}), PluginManager())


def test_rm_train_names_the_bad_line_of_a_pairs_file(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "1+2=", "chosen": 3}\n')
    code = armor(
        ["rm", "train", "--pairs", str(pairs), "--model", "builtin:arithmetic-tiny", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert f"{pairs}, line 2: 'chosen' must be text, got 3" in capsys.readouterr().err
