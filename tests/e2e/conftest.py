"""What the whole-run tests share: the overrides of a tiny run of the built-in task."""

from __future__ import annotations

import pytest

#: a run of the built-in task small enough for a test: two prompts a step, two samples each, four new tokens,
#: no validation before training, metrics to jsonl, one core a worker; a test adds its steps, checkpoints and
#: workers
TINY_RUN = (
    "data.train_size=64",
    "data.val_size=4",
    "data.train_batch_size=2",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=2",
    "rollout.max_new_tokens=4",
    "trainer.loggers=[jsonl]",
    "trainer.val_before_train=false",
    "engine.cpus_per_worker=1",
)


@pytest.fixture
def tiny_run() -> list[str]:
    """``TINY_RUN``'s overrides, a list of the test's own."""
    return list(TINY_RUN)
