"""An environment's observation as the token ids appended after an assistant turn, without ever
re-tokenising what was sampled.

Earlier turns stay the ids the policy sampled; only the observation is tokenised, as the *delta* the
tokenizer's chat template adds when the messages are appended. The delta is found on a fixed probe
conversation (a user message, an assistant message): rendering it with and without the
observation's messages, the second must extend the first (an append-only template; Qwen2.5/3,
Llama 3 and DeepSeek templates are), and the part after the probe assistant's content is what
follows a sampled turn:

    <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n

When the sampled turn ended with an end-of-turn token whose text starts that tail (``<|im_end|>``),
that text is dropped from the delta: the policy already produced it. A turn cut by the token budget
gets the whole tail, so the transcript stays well formed. Without a chat template an observation is
its text between newlines.

An observation longer than ``max_tokens`` has its messages' contents cut (the template around them
kept) and ``TRUNCATED`` appended, so the policy can see that it was cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["TRUNCATED", "ObservationError", "ObservationRenderer", "as_messages"]

TRUNCATED = " ...[truncated]"
_MARK = "ARMORPROBE"  # the probe assistant's content: a word no template writes on its own
_PROBE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]


class ObservationError(ValueError):
    """An observation that cannot become tokens: neither text nor chat messages."""


def as_messages(observation: Any, role: str = "user") -> list[dict[str, str]]:
    """An observation (text, one message, or a list of messages) as chat messages."""
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, Mapping):
        observation = [observation]
    if isinstance(observation, Sequence) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in observation
    ):
        return [{"role": m["role"], "content": m["content"]} for m in observation]
    raise ObservationError(
        f"an observation must be text or chat messages ({{'role': ..., 'content': text}}), got "
        f"{type(observation).__name__}: {str(observation)[:80]!r}"
    )


class ObservationRenderer:
    """``render(observation, ended_with)`` -> the token ids to append after a sampled turn."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, *, max_tokens: int, template_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.kwargs = dict(template_kwargs or {})
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        if self.templated:
            probe = self._chat(_PROBE, generation_prompt=False)
            self._closing = probe[probe.rfind(_MARK) + len(_MARK) :]  # what follows an assistant's content
            self._probe = probe

    def _chat(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return cast(  # tokenize=False: the rendered string
            str,
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt, **self.kwargs
            ),
        )

    def _text(self, messages: list[dict[str, str]], ended_with: str | None) -> str:
        if not self.templated:
            return "\n" + "\n".join(m["content"] for m in messages) + "\n"
        full = self._chat(_PROBE + messages, generation_prompt=True)
        if not full.startswith(self._probe):
            raise ObservationError(
                "the tokenizer's chat template is not append-only (rendering more messages changed the earlier "
                "ones), so an observation cannot be appended to the sampled ids; use a template that only appends"
            )
        delta = self._closing + full[len(self._probe) :]
        if ended_with and delta.startswith(ended_with):
            delta = delta[len(ended_with) :]  # the policy already sampled the end of its turn
        return delta

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, observation: Any, ended_with: str | None = None, role: str = "user") -> tuple[list[int], bool]:
        """The ids of ``observation`` and whether it was truncated.

        :param ended_with: the text of the end-of-turn token the sampled turn ended with, or None if the
            turn was cut by the token budget.
        :param role: the role plain text is given (tool results come as messages with role ``tool``).
        """
        messages = as_messages(observation, role)
        ids = self._ids(self._text(messages, ended_with))
        if len(ids) <= self.max_tokens:
            return ids, False
        # cut the contents, keep the template around them: bisect on the share of each content kept
        lo, hi, best = 0.0, 1.0, None
        for _ in range(20):
            mid = (lo + hi) / 2
            cut = [{**m, "content": m["content"][: int(len(m["content"]) * mid)] + TRUNCATED} for m in messages]
            trial = self._ids(self._text(cut, ended_with))
            if len(trial) <= self.max_tokens:
                lo, best = mid, trial
            else:
                hi = mid
        if best is None:  # even empty contents do not fit: keep the first max_tokens ids
            best = ids[: self.max_tokens]
        return best, True
