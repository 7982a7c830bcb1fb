"""The ``reasoning_gym`` reward domain: a reasoning-gym dataset's own ``score_answer`` on the rows of the
``reasoning_gym`` task (``armor_plugins/tasks/reasoning_gym.py``).

The row's ground truth names the dataset, its config and curriculum, and carries the entry
``{question, answer, metadata}``; the domain builds that dataset (once per process and config) and returns
``dataset.score_answer(answer, entry)``: reasoning-gym's checker, not a copy of it, so partial credit is the
dataset's own (many give a fraction for an answer that contains the right one).

The answer. reasoning-gym's datasets want the bare answer, and its own prompts (``SYSTEM_PROMPTS``, which
the task's ``prompt_format: chat`` uses) ask for it inside ``<answer>...</answer>``, read back with its
``extract_answer`` (the last such tag). ``answer_tag: auto`` (the default) does that when the response has a
tag and scores the whole response, whitespace stripped, when it has none (the ``text`` prompts of tiny
models, answered bare); ``required`` scores a response without a tag as no answer (``None``, which every
dataset scores 0); ``off`` always scores the whole response. Sub-scores: ``correct`` (the score is 1) and
``tagged`` (the response had an answer tag).

Not inline: some datasets' checkers parse with sympy or simulate a game, which a policy's answer could make
slow, so each check runs in the reward pool's killable workers under ``reward.timeout_s``. A checker that
raises is a failed check (``reward.failure_score``, counted).
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_plugins.tasks.reasoning_gym import DATA_SOURCE, decode_ground_truth, library

__all__ = ["check_reasoning_gym_truth", "extract_answer", "reasoning_gym_reward"]

_ANSWER_TAG = ("auto", "required", "off")


def extract_answer(response: str, answer_tag: str = "auto") -> tuple[str | None, bool]:
    """The answer reasoning-gym's ``score_answer`` is given, and whether the response had an ``<answer>`` tag."""
    if answer_tag not in _ANSWER_TAG:
        raise ValueError(f"reasoning_gym domain: answer_tag={answer_tag!r} must be one of {', '.join(_ANSWER_TAG)}")
    tagged = library().utils.extract_answer(response) if answer_tag != "off" else None
    if tagged is not None:
        return tagged, True
    return (None if answer_tag == "required" else response.strip()), False


def reasoning_gym_reward(
    prompt: Any, response: str, ground_truth: Any, extra: Mapping[str, Any], *, answer_tag: str = "auto"
) -> RewardResult:
    """The row's dataset's ``score_answer(answer, entry)``, in [0, 1].

    :param answer_tag: ``auto`` (the last ``<answer>`` tag's content when there is one, else the whole
        response), ``required`` (no tag: no answer) or ``off`` (the whole response).
    """
    answer, tagged = extract_answer(response, answer_tag)
    _, dataset, entry = decode_ground_truth(ground_truth)
    score = float(dataset.score_answer(answer, entry))
    return RewardResult(score, {"correct": float(score == 1.0), "tagged": float(tagged)})


def check_reasoning_gym_truth(ground_truth: Any, extra: Mapping[str, Any] | None = None) -> None:
    """Refuse, when the rows are loaded, a ground truth the ``reasoning_gym`` task did not write, or one whose
    dataset reasoning-gym does not have (``validate_ground_truth``).

    :raises ValueError: naming what was found and what is expected.
    """
    decode_ground_truth(ground_truth)


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        DATA_SOURCE,
        RewardDomain(
            reasoning_gym_reward,
            requires_ground_truth=True,
            description="a reasoning-gym dataset's own score_answer (rows of the reasoning_gym task)",
            score_range=(0.0, 1.0),
            validate_ground_truth=check_reasoning_gym_truth,
            inline=False,
        ),
    )
