"""Micro-batches by token budget (``actor.max_tokens_per_micro_batch``): how rows are split, and
the errors that name the key. That the split leaves the update unchanged is shown for every loss
aggregation, on one worker and on two, in ``parallel/test_parallel.py``."""

from __future__ import annotations

import pytest
import torch

from armor_core.config.schema import ConfigError, load_config
from armor_core.workers.common import micro_batches


def test_rows_are_split_in_order_while_their_tokens_fit():
    lengths = torch.tensor([5, 4, 2, 9, 1, 1, 6])
    split = micro_batches(lengths, rows=64, max_tokens=10)
    assert [s.tolist() for s in split] == [[0, 1], [2], [3, 4], [5, 6]]
    assert all(int(lengths[s].sum()) <= 10 for s in split)
    assert torch.equal(torch.cat(split), torch.arange(len(lengths)))  # every row once, in order (groups stay together)


def test_without_a_budget_micro_batches_hold_a_number_of_rows():
    assert [s.tolist() for s in micro_batches(torch.tensor([5, 4, 2, 9, 1]), rows=2)] == [[0, 1], [2, 3], [4]]


def test_a_row_longer_than_the_budget_names_the_key_the_row_and_what_would_work():
    with pytest.raises(
        ValueError,
        match=r"actor.max_tokens_per_micro_batch=8 cannot hold row 2 of this batch, which has 9 tokens.*at least 9",
    ):
        micro_batches(torch.tensor([5, 4, 9]), rows=64, max_tokens=8, key="actor.max_tokens_per_micro_batch")


def test_config_refuses_a_budget_that_cannot_hold_the_longest_possible_row():
    with pytest.raises(
        ConfigError,
        match=r"actor.max_tokens_per_micro_batch=40 cannot hold one row.*64 \+ 8 = 72 tokens; set it to at least 72",
    ):
        load_config(None, ["actor.max_tokens_per_micro_batch=40"])
    with pytest.raises(ConfigError, match=r"critic.max_tokens_per_micro_batch=10"):
        load_config(None, ["critic.max_tokens_per_micro_batch=10"])
    assert load_config(None, ["actor.max_tokens_per_micro_batch=72"]).actor.max_tokens_per_micro_batch == 72


def test_config_checks_the_chunk_offload_and_dtype():
    with pytest.raises(ConfigError, match="actor.logprob_chunk_tokens"):
        load_config(None, ["actor.logprob_chunk_tokens=-1"])
    with pytest.raises(ConfigError, match="actor.offload=true needs trainer.device=cuda and actor.strategy=fsdp2"):
        load_config(None, ["actor.offload=true"])
    with pytest.raises(ConfigError, match="model.dtype='float16'.*loss scaling"):
        load_config(None, ["model.dtype=float16"])
