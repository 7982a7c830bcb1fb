"""What the game environments' tests share: episodes of game rows played by the tiny chat model through the real
multi-turn rollout, and their scores through the trainer's ``Scorer`` and a real ``RewardManager``."""

from __future__ import annotations

import importlib.metadata

import pytest

from armor_core.config.schema import MultiTurnConfig, RewardConfig, RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.loop.step import Scorer
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager
from armor_core.workers.rollout.multi_turn import MultiTurnRollout
from armor_plugins.rollout.hf import HFRollout


@pytest.fixture
def play_games(chat_model, chat_tokenizer):
    """``play(rows, env_cls, n=1, **multi_turn) -> DataProto``: the rows (``text_game`` layout) played to the end,
    with the rows' columns (``raw_prompt``, ``data_source``, ``ground_truth``, ``extra``) kept, ready to score."""

    def play(rows, env_cls, n=1, max_new_tokens=4, **multi_turn):
        config = RolloutConfig(
            max_new_tokens=max_new_tokens, temperature=1.0, multi_turn=MultiTurnConfig(enable=True, **multi_turn)
        )
        rollout = MultiTurnRollout(HFRollout(chat_model, chat_tokenizer, config), chat_tokenizer, config, env_cls)
        texts = [
            chat_tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows
        ]
        enc = chat_tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        prompts = DataProto.from_dict(
            tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
            non_tensors={
                "raw_prompt": [r["prompt"][-1]["content"] for r in rows],
                "data_source": [r["data_source"] for r in rows],
                "ground_truth": [r["ground_truth"] for r in rows],
                "extra": [dict(r["extra_info"]) for r in rows],
            },
        )
        return rollout.generate(prompts, n=n)

    return play


@pytest.fixture
def score_games(chat_tokenizer):
    """``score(batch, **reward) -> (scores, metrics)``: the trainer's ``Scorer`` over a ``RewardManager`` that
    watches failures (as a training run's does) with ``reward`` set in its config, only the ``game`` domain loaded."""
    everything = {e.name for e in importlib.metadata.entry_points(group="armor")}
    pm = PluginManager(disabled=everything - {"game"})

    def score(batch, **reward):
        manager = RewardManager(RewardConfig(**reward), pm, watch_failures=True)
        scores, metrics, _ = Scorer(manager, chat_tokenizer).score(batch)
        return scores, metrics

    return score
