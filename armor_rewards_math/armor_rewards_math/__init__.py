"""armor-rewards-math: verifiable math rewards for ARMOR.

Registers two reward domains (see ``domains.py`` for their parameters and sub-scores):

- ``math``: the final ``\\boxed{}`` answer (or "Final answer: ...") checked for mathematical
  equivalence with math-verify, with anti-hacking rules (hedging, restating the prompt, answers
  copied from it, an optional required format), limits that refuse answers too costly to check
  (``limits.py``) and an optional DAPO overlong penalty.
- ``gsm8k``: ``#### 42`` (or boxed, "the answer is", the last number), compared as numbers.

The built-in ``arithmetic`` task's domain ships with armor-rl itself, so that its default run needs no pack.
"""

from armor_core import RewardDomain, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_rewards_math.domains import answer_score_range, gsm8k_reward, math_reward, warm_up
from armor_rewards_math.judge import check_ground_truth

__all__ = ["gsm8k_reward", "math_reward"]


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "math",
        RewardDomain(
            math_reward,
            requires_ground_truth=True,
            description="final boxed answer, checked for equivalence (math-verify)",
            score_range=answer_score_range,
            validate_ground_truth=check_ground_truth,
            warmup=warm_up,
        ),
    )
    register(
        "gsm8k",
        RewardDomain(
            gsm8k_reward,
            requires_ground_truth=True,
            description="GSM8K '#### n' answers, compared as numbers",
            score_range=answer_score_range,
            validate_ground_truth=check_ground_truth,
            inline=True,
        ),
    )
