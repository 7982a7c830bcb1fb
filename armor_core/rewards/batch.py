"""The one-row call of a reward object that scores in batches: its ``score_batch`` on a batch of one.

A domain built on such an object (``reward.remote``, ``reward.judge``, ``reward.model``, a ``placement: worker``
scorer, a ``reward.custom`` file function) uses it as both its ``fn`` and its ``batch_fn``; ``OneRowFromBatch``
writes the ``fn`` once.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

from armor_core.interfaces import RewardResult

__all__ = ["ROW_PARAMETERS", "OneRowFromBatch", "one_result"]

#: a domain ``fn``'s row arguments, as ``inspect`` parameters: what ``check_params`` skips before the keywords
ROW_PARAMETERS = tuple(
    inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for n in ("prompt", "response", "ground_truth", "extra")
)


def one_result(results: Sequence[RewardResult | Exception]) -> RewardResult:
    """A batch function's one row, for a domain's single-row ``fn``: its result, or its error raised."""
    if isinstance(results[0], Exception):
        raise results[0]
    return results[0]


class OneRowFromBatch:
    """A reward object callable on one row (a domain's ``fn``) through its ``score_batch`` (its ``batch_fn``).

    ``__call__`` passes keyword parameters (``reward.domain_kwargs``) on to ``score_batch``, but the signature
    ``check_params`` reads is the four row arguments alone (``__signature__``), so a parameter is refused at start
    unless a subclass declares it: ``FileFunction`` sets its own, from the file's function.
    """

    #: what ``inspect.signature`` (``rewards.checks.check_params``) reads: the row's four arguments, no keywords
    __signature__ = inspect.Signature(ROW_PARAMETERS)

    def __call__(
        self, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any], **params: Any
    ) -> RewardResult:
        return one_result(self.score_batch([prompt], [response], [ground_truth], [extra], **params))

    def score_batch(self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any],
                    extras: Sequence[Mapping[str, Any]]) -> Sequence[RewardResult | Exception]:  # fmt: skip
        """One RewardResult per row, or the error of a row that could not be scored (each subclass's own)."""
        raise NotImplementedError
