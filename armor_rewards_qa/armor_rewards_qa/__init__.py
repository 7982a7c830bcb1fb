"""armor-rewards-qa: knowledge-QA rewards for ARMOR, in English and Chinese.

Registers two reward domains (see ``domains.py`` for their parameters and sub-scores):

- ``multiple_choice``: the option a response chose (a letter, several letters, or an option's
  text), read by the anchoring rules of ``choice.py``; hedging scores 0.
- ``short_answer``: the answer of a short-answer response (``short.py``) against one or more
  accepted answers, after normalisation (``text.py``), with numbers and units (``quantity.py``).
"""

from armor_core import RewardDomain, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_rewards_qa.choice import Choice, read_choice
from armor_rewards_qa.domains import (
    answer_score_range,
    check_accepted_answers,
    check_choice_truth,
    multiple_choice_reward,
    short_answer_reward,
)
from armor_rewards_qa.short import read_answer

__all__ = ["Choice", "multiple_choice_reward", "read_answer", "read_choice", "short_answer_reward"]


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "multiple_choice",
        RewardDomain(
            multiple_choice_reward,
            requires_ground_truth=True,
            validate_ground_truth=check_choice_truth,
            description="the chosen option (letter or text, EN/ZH); hedging scores 0",
            score_range=answer_score_range,
            inline=True,
        ),
    )
    register(
        "short_answer",
        RewardDomain(
            short_answer_reward,
            requires_ground_truth=True,
            validate_ground_truth=check_accepted_answers,
            description="normalised exact match against accepted answers, numbers with units (EN/ZH)",
            score_range=answer_score_range,
            inline=True,
        ),
    )
