"""Whole runs on tiny Qwen3 and DeepSeek-V3 models with chat-format JSONL data; `armor eval`; and bad
input caught before any worker starts."""

from __future__ import annotations

import json

import pytest

from armor_core.cli.main import main
from armor_core.config.schema import load_config
from armor_core.loop.data import DataError
from armor_core.loop.trainer import Trainer
from armor_core.models.loading import ModelPathError, build_char_tokenizer, build_tiny_model

pytestmark = pytest.mark.slow

CHARS = "0123456789+=?: abcdefghijklmnopqrstuvwxyzW"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def make_model(path, arch, chat_template=True):
    tok = build_char_tokenizer(CHARS)
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    overrides = {"hidden_size": 64, "num_heads": 2, "num_layers": 2}
    model = build_tiny_model(arch, len(tok), **overrides)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_rows(path, n, chat=True):
    rows = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        prompt = [{"role": "user", "content": f"{a}+{b}="}] if chat else f"{a}+{b}="
        rows.append({"prompt": prompt, "data_source": "arithmetic", "reward_model": {"ground_truth": str(a + b)}})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def overrides(tmp_path, model, **extra):
    base = {
        "model.path": str(model),
        "data.train_files": f"[{write_rows(tmp_path / 'train.jsonl', 32)}]",
        "data.val_files": f"[{write_rows(tmp_path / 'val.jsonl', 8)}]",
        "data.train_batch_size": 4,
        "actor.ppo_mini_batch_size": 4,
        "rollout.n": 2,
        "rollout.max_new_tokens": 3,
        "trainer.total_steps": 2,
        "trainer.loggers": "[jsonl]",
        "trainer.run_dir": str(tmp_path / "run"),
        "engine.cpus_per_worker": 1,
        "trainer.val_sampled": True,
        **extra,
    }
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.parametrize("arch", ["qwen3", "deepseek_v3"])
def test_tiny_architectures_train_on_chat_data(ray_cluster, tmp_path, arch):
    model = make_model(tmp_path / arch, arch)
    # a random model scores 0 everywhere: every row is forwarded anyway, as a real update would be
    trainer = Trainer(load_config(None, overrides(tmp_path, model, **{"actor.skip_zero_advantage": "false"})))
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    assert summary["steps"] == 2
    for key in ("val/arithmetic/acc_greedy", "val/arithmetic/acc_sampled", "val/acc_greedy"):
        assert 0.0 <= summary["val_after"][key] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("actor/pg_loss" in r for r in rows)
    # an MoE model's routing is logged every step (models/moe.py); a dense model has none
    updates = [r for r in rows if "actor/pg_loss" in r]
    if arch == "deepseek_v3":
        assert all(1 <= r["moe/load_max"] <= 4 and 0 < r["moe/load_entropy"] <= 1 for r in updates)
    else:
        assert not any(k.startswith("moe/") for r in rows for k in r)


def test_armor_eval_reports_accuracy_per_data_source(tmp_path, capsys):
    model = make_model(tmp_path / "m", "qwen2")
    data = write_rows(tmp_path / "val.jsonl", 6, chat=False)
    assert main(["eval", str(model), "--data", str(data), "--json", "rollout.max_new_tokens=3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 6 and 0.0 <= out["arithmetic/acc_greedy"] <= 1.0
    assert main(["eval", "builtin:arithmetic-tiny", "--data", "task:arithmetic", "--size", "100", "--json"]) == 0
    builtin = json.loads(capsys.readouterr().out)
    assert 0.3 <= builtin["arithmetic/acc_greedy"] <= 0.7  # the shipped warm start sits near 50%


def test_bad_input_fails_before_any_worker_starts(tmp_path, monkeypatch):
    def no_workers(self):
        raise AssertionError("workers were started before the input was checked")

    monkeypatch.setattr(Trainer, "_start_workers", no_workers)
    no_template = make_model(tmp_path / "plain", "qwen2", chat_template=False)
    cases = [
        (overrides(tmp_path, tmp_path / "missing"), ModelPathError, "does not exist"),
        (overrides(tmp_path, no_template), DataError, "chat template"),
    ]
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text(
        json.dumps({"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2"})
        + "\n"
        + json.dumps({"prompt": "1+1=", "data_source": "arithmetic"})
        + "\n"
    )
    cases.append(
        (
            overrides(tmp_path, make_model(tmp_path / "ok", "qwen2"), **{"data.train_files": f"[{bad_rows}]"}),
            DataError,
            "line 2: missing 'ground_truth'",
        )
    )
    for ovr, exc, message in cases:
        with pytest.raises(exc, match=message):
            Trainer(load_config(None, ovr))
