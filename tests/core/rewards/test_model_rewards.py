"""A classifier reward model: ``armor rm train`` fits one on preference pairs from a hidden rule (the
answer's last digit is even) and ranks held-out pairs; ``reward.model`` scores rows with it in the reward
pool, normalised, beside its rule at weight 0 with the gap logged; bad settings fail at start. With LoRA only the
targets and the score head change; on two gloo ranks the result is one process's."""

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


def test_domain_map_routes_rows_to_a_reward_model_beside_a_rule(rm_dir):
    from armor_core.config.plugin_checks import validate_plugins
    from armor_core.config.schema import load_config

    cfg = load_config(None, [f"reward.model={{path: '{rm_dir}'}}", "reward.domain_map.chat={rm: 1.0, format: 0.2}"])
    validate_plugins(cfg, PluginManager())  # what armor run checks first: 'rm' is the config's own domain
    with RewardManager(cfg.reward, PluginManager()) as manager:
        assert manager.domains_for("chat") == {"rm": 1.0, "format": 0.2}


def test_rm_train_names_the_bad_line_of_a_pairs_file(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "1+2=", "chosen": 3}\n')
    code = armor(
        ["rm", "train", "--pairs", str(pairs), "--model", "builtin:arithmetic-tiny", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert f"{pairs}, line 2: 'chosen' must be text, got 3" in capsys.readouterr().err


def test_rm_train_names_the_line_of_a_pairs_file_that_is_not_utf8(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    good = b'{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
    pairs.write_bytes(good + good + b'{"prompt": "caf\xe9", "chosen": "2", "rejected": "3"}\n')  # Latin-1
    code = armor(
        ["rm", "train", "--pairs", str(pairs), "--model", "builtin:arithmetic-tiny", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert f"{pairs}, line 3: not UTF-8 text (byte 0xe9 at the line's byte 16)" in capsys.readouterr().err


def _weights(directory):
    from safetensors.torch import load_file

    return {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(f).items()}


def _base_weights():
    from armor_core.models.loading import load_model

    return load_model("builtin:arithmetic-tiny").state_dict()


@pytest.mark.slow  # a training run: 40 steps
def test_rm_train_with_lora_adapts_only_its_targets_and_writes_a_directory_reward_model_loads(tmp_path):
    import torch

    pairs, held_out = _pairs(tmp_path / "pairs.jsonl", 400, 0), _pairs(tmp_path / "held_out.jsonl", 100, 1)
    out = tmp_path / "rm_lora"
    code = armor(
        ["rm", "train", "--pairs", str(pairs), "--val-pairs", str(held_out), "--model", "builtin:arithmetic-tiny",
         "--out", str(out), "--steps", "40", "--eval-every", "40", "--lr", "1e-2", "--threads", "1",
         "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj"]
    )  # fmt: skip
    assert code == 0
    record = json.loads((out / "armor_rm.json").read_text())
    base, trained = _base_weights(), _weights(out)
    assert not any("lora" in k for k in trained)  # merged: a plain classifier
    changed = {k for k, v in trained.items() if k != "score.weight" and not torch.equal(v, base[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)
    layers = sum(k.endswith("q_proj.weight") for k in trained)
    q, v = trained["model.layers.0.self_attn.q_proj.weight"], trained["model.layers.0.self_attn.v_proj.weight"]
    adapters = layers * 4 * (q.shape[0] + q.shape[1] + v.shape[0] + v.shape[1])  # A: r x in, B: out x r
    assert record["trainable_params"] == adapters + trained["score.weight"].numel()
    assert record["val_accuracy"] >= 0.9 > record["val_accuracy_before"]  # the hidden rule, learnt by the adapters
    with RewardManager(RewardConfig(model={"path": str(out)}), PluginManager()) as manager:
        batch = manager.score(["1+1="] * 2, ["24", "37"], ["rm"] * 2, [None] * 2)
    assert batch.metrics["reward/rm/failures"] == 0.0


def test_rm_train_refuses_lora_on_the_score_head_and_a_batch_the_ranks_cannot_share(tmp_path, capsys):
    pairs = _pairs(tmp_path / "pairs.jsonl", 8, 0)
    args = ["rm", "train", "--pairs", str(pairs), "--model", "builtin:arithmetic-tiny", "--out", str(tmp_path / "o")]
    assert armor([*args, "--lora-rank", "2", "--lora-targets", "score"]) == 2
    assert "--lora-targets 'score' names the score head ['score']" in capsys.readouterr().err
    assert armor([*args, "--lora-rank", "2", "--lora-targets", "nope"]) == 2
    assert "--lora-targets: 'nope' matches no module" in capsys.readouterr().err
    assert armor([*args, "--batch-size", "5", "--nproc", "2"]) == 2
    assert "--batch-size=5 must be a multiple of --nproc=2" in capsys.readouterr().err


@pytest.mark.slow
def test_rm_train_on_two_gloo_ranks_equals_one_process_on_the_same_batches(tmp_path):
    import torch

    pairs = _pairs(tmp_path / "pairs.jsonl", 64, 0)
    args = ["rm", "train", "--pairs", str(pairs), "--model", "builtin:arithmetic-tiny", "--steps", "4",
            "--eval-every", "4", "--lr", "1e-3", "--batch-size", "8", "--threads", "1"]  # fmt: skip
    assert armor([*args, "--out", str(tmp_path / "one")]) == 0
    assert armor([*args, "--out", str(tmp_path / "two"), "--nproc", "2"]) == 0
    one, two, base = _weights(tmp_path / "one"), _weights(tmp_path / "two"), _base_weights()
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5)
    # the steps moved the weights far past that tolerance: equal because the same updates were made
    embed = "model.embed_tokens.weight"
    assert (one[embed] - base[embed]).abs().max() > 1e-3
    first, record = (json.loads((tmp_path / d / "armor_rm.json").read_text()) for d in ("one", "two"))
    assert record["args"]["nproc"] == 2 and first["args"]["nproc"] == 1
    assert record["history"][-1]["loss"] == pytest.approx(first["history"][-1]["loss"], abs=1e-3)
    assert record["score_mean"] == pytest.approx(first["score_mean"], abs=1e-4)
