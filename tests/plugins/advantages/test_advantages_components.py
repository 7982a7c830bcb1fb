"""``algorithm.adv_kwargs.normalize_components`` (GDPO): each reward component standardised within
its group before the weighted sum; hand-computed cases, and the path from scoring to the estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import armor_plugins.advantages.grpo as grpo_plugin
import armor_plugins.rewards.format as format_plugin
import armor_plugins.rewards.length as length_plugin
from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.schema import ConfigError, RewardConfig, load_config
from armor_core.dataproto.protocol import DataProto
from armor_core.loop.step import Scorer, Step, StepResult
from armor_core.loop.step_timer import StepTimer
from armor_core.ops.groups import normalize_reward_components
from armor_core.plugins import PluginManager, get_plugin_manager
from armor_core.rewards.manager import RewardManager
from armor_plugins.advantages.grpo import compute_dr_grpo_advantage, compute_grpo_advantage
from armor_plugins.advantages.opo import compute_opo_advantage
from armor_plugins.advantages.pass_at_k import compute_pass_at_k_advantage
from armor_plugins.advantages.reinforce_plus_plus import compute_reinforce_plus_plus_baseline_advantage
from armor_plugins.advantages.rloo import compute_rloo_advantage

Z = 0.5**0.5  # sqrt(1/2)


def last_token_batch(scores, T=3):
    """Full-length rows with each score on the last token."""
    rewards = torch.zeros(len(scores), T)
    rewards[:, -1] = torch.tensor(scores)
    return rewards, torch.ones(len(scores), T)


# Group 0 (rows 0-3), routed to math (weight 1) and format (weight 0.5):
#   math   [1, 0, 0, 0]: mean 0.25, unbiased var (0.75^2 + 3 * 0.25^2) / 3 = 0.25, std 0.5 -> z [1.5, -0.5, -0.5, -0.5]
#   format [1, 1, 1, 0]: mean 0.75, var (3 * 0.25^2 + 0.75^2) / 3 = 0.25, std 0.5      -> z [0.5, 0.5, 0.5, -1.5]
#   z_math + 0.5 z_format = [1.75, -0.25, -0.25, -1.25]   (raw weighted sums: [1.5, 0.5, 0.5, 0])
# Group 1 (rows 4-5), routed to math only: math [0, 1]: mean 0.5, std sqrt(0.5) -> z [-sqrt(1/2), sqrt(1/2)];
#   format takes no part in its statistics and adds nothing.
# Group 2 (rows 6-7): math [1, 1] equal -> 0; format [0, 1] -> 0.5 * z = [-0.5 sqrt(1/2), 0.5 sqrt(1/2)].
COMPONENTS = [
    {"math": (1.0, 1.0), "format": (1.0, 0.5)},
    {"math": (0.0, 1.0), "format": (1.0, 0.5)},
    {"math": (0.0, 1.0), "format": (1.0, 0.5)},
    {"math": (0.0, 1.0), "format": (0.0, 0.5)},
    {"math": (0.0, 1.0)},
    {"math": (1.0, 1.0)},
    {"math": (1.0, 1.0), "format": (0.0, 0.5)},
    {"math": (1.0, 1.0), "format": (1.0, 0.5)},
]
INDEX = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
RAW = [1.5, 0.5, 0.5, 0.0, 0.0, 1.0, 1.0, 1.5]  # sum of weight * score per row
NORMALISED = [1.75, -0.25, -0.25, -1.25, -Z, Z, -0.5 * Z, 0.5 * Z]


def test_components_are_standardised_within_their_group_then_weighted():
    out = normalize_reward_components(
        torch.tensor(RAW, dtype=torch.float64), INDEX, torch.ones(8, dtype=torch.bool), COMPONENTS
    )
    torch.testing.assert_close(out, torch.tensor(NORMALISED, dtype=torch.float64), atol=1e-5, rtol=0)


def test_dr_grpo_with_normalize_components_by_hand():
    rewards, mask = last_token_batch(RAW)
    adv, _ = compute_dr_grpo_advantage(rewards, mask, INDEX, normalize_components=True, reward_components=COMPONENTS)
    # each group's normalised scores already have mean 0, so Dr. GRPO's advantage is them
    torch.testing.assert_close(adv[:, -1], torch.tensor(NORMALISED, dtype=torch.float32), atol=1e-5, rtol=0)
    plain, _ = compute_dr_grpo_advantage(rewards, mask, INDEX)
    # without it: group 0's raw sums [1.5, 0.5, 0.5, 0] minus their mean 0.625
    torch.testing.assert_close(plain[:4, -1], torch.tensor([0.875, -0.125, -0.125, -0.625]), atol=1e-6, rtol=0)


def test_what_else_the_reward_holds_is_kept():
    # a KL penalty of -0.1 folded into row 1's reward on an earlier token: its outcome score is 0.4
    # = 0.5 (components) - 0.1; normalised: -0.25 - 0.1 = -0.35. Group 0: [1.75, -0.35, -0.25, -1.25],
    # mean -0.025 -> Dr. GRPO advantages [1.775, -0.325, -0.225, -1.225]
    rewards, mask = last_token_batch(RAW)
    rewards[1, 0] = -0.1
    adv, _ = compute_dr_grpo_advantage(rewards, mask, INDEX, normalize_components=True, reward_components=COMPONENTS)
    torch.testing.assert_close(adv[:4, 0], torch.tensor([1.775, -0.325, -0.225, -1.225]), atol=1e-5, rtol=0)


def test_weights_not_raw_scales_decide():
    # math scores 0 or 0.2 (weight 1), format 0 or 1 (weight 0.5): summed, the format-only row (0.5)
    # beats the math-only row (0.2) although math weighs twice as much; standardised, math's weight wins
    comps = [
        {"math": (0.2, 1.0), "format": (0.0, 0.5)},
        {"math": (0.0, 1.0), "format": (1.0, 0.5)},
        {"math": (0.0, 1.0), "format": (0.0, 0.5)},
        {"math": (0.0, 1.0), "format": (0.0, 0.5)},
    ]
    rewards, mask = last_token_batch([0.2, 0.5, 0.0, 0.0])
    index = torch.zeros(4, dtype=torch.long)
    plain, _ = compute_grpo_advantage(rewards, mask, index)
    gdpo, _ = compute_grpo_advantage(rewards, mask, index, normalize_components=True, reward_components=comps)
    assert plain[0, -1] < plain[1, -1] and gdpo[0, -1] > gdpo[1, -1]


@pytest.mark.parametrize(
    "estimator",
    [
        compute_grpo_advantage,
        compute_dr_grpo_advantage,
        compute_rloo_advantage,
        compute_opo_advantage,
        compute_reinforce_plus_plus_baseline_advantage,
        compute_pass_at_k_advantage,
    ],
)
def test_every_grouped_estimator_runs_on_the_normalised_scores(estimator):
    params = {"k": 2} if estimator is compute_pass_at_k_advantage else {}
    rewards, mask = last_token_batch(RAW)
    normalised, _ = last_token_batch(NORMALISED)
    adv, _ = estimator(rewards, mask, INDEX, normalize_components=True, reward_components=COMPONENTS, **params)
    expected, _ = estimator(normalised, mask, INDEX, **params)
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="normalize_components needs each row's reward components"):
        estimator(rewards, mask, INDEX, normalize_components=True, **params)


def test_normalize_components_needs_a_grouped_estimator():
    for estimator in ("gae", "reinforce_plus_plus"):
        cfg = load_config(
            None, [f"algorithm.adv_estimator={estimator}", "algorithm.adv_kwargs={normalize_components: true}"]
        )
        with pytest.raises(
            ConfigError,
            match=rf"normalize_components=true .*adv_estimator='{estimator}' has no groups; use one that does .*grpo",
        ):
            validate_plugins(cfg, get_plugin_manager())
    validate_plugins(
        load_config(None, ["algorithm.adv_kwargs={normalize_components: true}"]), get_plugin_manager()
    )  # grpo: fine


# -- from the scoring step to the estimator -----------------------------------------------------------


def correct(prompt, response, ground_truth, extra):
    return RewardResult(float(ground_truth in response))


class _Correct:
    @hookimpl
    def armor_register_reward_domains(self, register):
        register("correct", RewardDomain(correct, requires_ground_truth=True, inline=True))


class CharTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def test_the_scorer_hands_each_rows_components_to_the_estimator():
    pm = PluginManager(load_entrypoints=False, disabled=())
    for plugin in (format_plugin, length_plugin, grpo_plugin, _Correct()):
        pm.register(plugin)
    texts = [r"\boxed{4}", "4", r"\boxed{5}", "5", "4", "5"]
    sources = ["boxed_math"] * 4 + ["plain"] * 2
    T = max(map(len, texts))
    responses = torch.zeros(6, T, dtype=torch.long)
    mask = torch.zeros(6, T, dtype=torch.long)
    for i, t in enumerate(texts):
        responses[i, : len(t)], mask[i, : len(t)] = torch.tensor([ord(c) for c in t]), 1
    batch = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "raw_prompt": ["2+2?"] * 6,
            "data_source": sources,
            "ground_truth": ["4"] * 6,
            "extra": [{}] * 6,
            "uid": [0, 0, 0, 0, 1, 1],
        },
    )
    cfg = load_config(None, ["algorithm.adv_estimator=dr_grpo", "algorithm.adv_kwargs={normalize_components: true}"])
    rm = RewardManager(
        RewardConfig(
            domain_map={"boxed_math": {"correct": 1.0, "format": 0.5}, "plain": "correct"},
            domain_kwargs={"format": {"preset": "boxed"}},
        ),
        pm,
    )
    scores, _ = Scorer(rm, CharTokenizer())(batch)
    assert scores.tolist() == [1.5, 1.0, 0.5, 0.0, 1.0, 0.0]
    assert batch["reward_components"][0] == {"correct": (1.0, 1.0), "format": (1.0, 0.5)} and batch[
        "reward_components"
    ][4] == {"correct": (1.0, 1.0)}
    batch["token_level_scores"] = torch.zeros(6, T).scatter_(1, (mask.sum(-1, keepdim=True) - 1), scores.unsqueeze(-1))
    step = Step(cfg, pm, pm.get("advantage_estimator", "dr_grpo"), None, None, None, None, None, None, None)
    out = step._advantages(batch, StepResult({}, StepTimer()))
    # group 0: correct [1, 1, 0, 0] -> z [Z', Z', -Z', -Z'] with std sqrt(1/3), Z' = 0.5 / sqrt(1/3) = sqrt(3)/2;
    # format [1, 0, 1, 0] -> the same shape across rows; 0.5 weight. Group 1: correct [1, 0] -> [Z, -Z]
    h = 3**0.5 / 2
    expected = [h + 0.5 * h, h - 0.5 * h, -h + 0.5 * h, -h - 0.5 * h, Z, -Z]
    got = [float(out["advantages"][i, int(mask[i].sum()) - 1]) for i in range(6)]
    np.testing.assert_allclose(got, expected, atol=1e-5)
