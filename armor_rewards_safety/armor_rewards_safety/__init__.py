"""armor-rewards-safety: rule-based safety rewards for ARMOR, in English and Chinese.

Registers two reward domains (see ``domains.py``): ``refusal`` (classify a response as a full
refusal, a partial refusal or compliance, and reward the behaviour asked for) and ``safety``
(refuse prompts labelled unsafe, answer prompts labelled safe, leak no personal data). The rules
are phrase lists in ``rules/<lang>.txt``, extensible without code; for English, a logistic
regression (``learned.py``, weights in ``models/refusal_en.json``, trained by ``train.py``) reviews
what the rules call compliance.
"""

from armor_core import RewardDomain, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_rewards_safety.domains import refusal_reward, refusal_score_range, safety_reward, safety_score_range
from armor_rewards_safety.pii import find_pii, leaked_pii
from armor_rewards_safety.refusal import RefusalVerdict, classify_refusal
from armor_rewards_safety.ruleset import load_rules

__all__ = [
    "RefusalVerdict",
    "classify_refusal",
    "find_pii",
    "leaked_pii",
    "load_rules",
    "refusal_reward",
    "safety_reward",
]


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "refusal",
        RewardDomain(
            refusal_reward,
            requires_ground_truth=False,
            description="full refusal / partial refusal / compliance, from rules and a learned model",
            score_range=refusal_score_range,
            inline=True,
        ),
    )
    register(
        "safety",
        RewardDomain(
            safety_reward,
            requires_ground_truth=True,
            description="refuse unsafe prompts, answer safe ones, leak no personal data",
            score_range=safety_score_range,
            inline=True,
        ),
    )
