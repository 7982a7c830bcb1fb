"""armor-rewards-code: verifiable code rewards for ARMOR, tests run in a sandbox.

Registers the reward domain ``code`` (``domain.py``): the program in a response runs against the row's
stdin/stdout cases, function-call cases or assertion program (``cases.py``) in the local sandbox
(``sandbox.py``, with the in-sandbox ``harness.py``), and scores the fraction or all of the cases passed.
"""

from armor_core import RewardDomain, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_rewards_code.cases import RUNNERS, Runner, extract_program
from armor_rewards_code.domain import check_code_truth, code_reward

__all__ = ["RUNNERS", "Runner", "code_reward", "extract_program"]


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "code",
        RewardDomain(
            code_reward,
            requires_ground_truth=True,
            validate_ground_truth=check_code_truth,
            description="runs the response's program on the row's tests in a sandbox (stdio, calls, asserts)",
            score_range=(0.0, 1.0),
        ),
    )
