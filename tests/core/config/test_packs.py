"""``armor_core.config.packs``: the table of the packs' reward domains is true, and a run that names a
domain of a pack that is not installed fails at start with one line saying what to install."""

from __future__ import annotations

import importlib

import pytest

import armor_plugins.rewards.arithmetic as arithmetic_plugin
from armor_core.config.packs import DOMAIN_PACKS
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.schema import ConfigError, RewardConfig, load_config
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager
from armor_core.testing import registered

PACKS = {
    "armor-rewards-code": "armor_rewards_code",
    "armor-rewards-math": "armor_rewards_math",
    "armor-rewards-qa": "armor_rewards_qa",
    "armor-rewards-safety": "armor_rewards_safety",
}


@pytest.mark.parametrize("dist", sorted(PACKS))
def test_the_table_lists_exactly_the_domains_each_pack_registers(dist):
    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(importlib.import_module(PACKS[dist]), name=dist)
    assert pm.names("reward_domain") == sorted(d for d, p in DOMAIN_PACKS.items() if p == dist)


def test_a_data_source_of_a_missing_pack_names_the_pip_install():
    with registered(arithmetic_plugin, load_entrypoints=False) as pm:
        rm = RewardManager(RewardConfig(), pm)
        with pytest.raises(ConfigError) as e:
            rm.check_rows([{"prompt": "q", "data_source": "math", "ground_truth": "1"}], "t.jsonl")
        rm.close()
    message = str(e.value)
    assert "\n" not in message and message.endswith("pip install armor-rewards-math")
    assert "data_source 'math'" in message


def test_a_domain_map_naming_a_missing_pack_fails_validation_with_the_pip_install():
    cfg = load_config(overrides=["reward.domain_map.mc=multiple_choice"])
    pm = PluginManager(disabled={"qa"})  # every installed plugin but the QA pack
    with pytest.raises(ConfigError, match=r"^reward.domain_map.mc: .*pip install armor-rewards-qa$"):
        validate_plugins(cfg, pm)
    with pytest.raises(ConfigError, match=r"pip install armor-rewards-qa$"):
        RewardManager(RewardConfig(domain_kwargs={"short_answer": {}}), pm)


def test_an_unknown_domain_of_no_pack_still_lists_the_known_ones():
    with registered(arithmetic_plugin, load_entrypoints=False) as pm:
        with pytest.raises(ConfigError, match="Known domains: arithmetic"):
            RewardManager(RewardConfig(domain_map={"x": "arithmetc"}), pm)
