"""Per-sample seeds through the whole trainer: the same rows give the same samples whatever the rollout's
micro-batch size, worker count or mode, so runs that differ only in those train alike, step for step."""

from __future__ import annotations

import json

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow

BASE = [
    "data.train_size=256",
    "data.val_size=16",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "rollout.top_p=0.9",
    "engine.cpus_per_worker=1",
    "trainer.loggers=[jsonl]",
    "trainer.total_steps=12",
    "trainer.val_freq=0",
    "trainer.val_before_train=false",
]
#: what the rows' samples decide: their scores and lengths, and what the update made of them
SAMPLE_KEYS = (
    "critic/score/mean",
    "critic/score/max",
    "response_length/mean",
    "response_length/max",
    "actor/pg_loss",
)


def _run(run_dir, *overrides: str) -> list[dict]:
    trainer = Trainer(load_config(None, [*BASE, f"trainer.run_dir={run_dir}", *overrides]))
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in SAMPLE_KEYS} for r in rows if "actor/pg_loss" in r]


def test_twelve_steps_sample_alike_at_any_micro_batch_size_worker_count_and_mode(ray_cluster, tmp_path):
    base = _run(tmp_path / "base")
    assert len(base) == 12 and len({r["critic/score/mean"] for r in base}) > 3  # it learns: the scores move
    # a rollout worker of its own generating each batch with the newest weights (async, no overlap)
    assert _run(tmp_path / "async", "rollout.mode=async", "rollout.max_staleness=0") == base
    # two actor ranks, each generating half of every batch in micro-batches of 3 rows (so rows meet other neighbours
    # in every forward); their update (DDP) equals one rank's to float rounding, so the policy loss may differ in its
    # last bits while the samples, scores and lengths do not
    two = _run(tmp_path / "ranks", "actor.num_workers=2", "rollout.micro_batch_size=3")
    assert [{**r, "actor/pg_loss": 0} for r in two] == [{**r, "actor/pg_loss": 0} for r in base]
    assert [r["actor/pg_loss"] for r in two] == pytest.approx([r["actor/pg_loss"] for r in base], abs=1e-5)
