"""The ``format`` reward domain: does a response follow a configured structure?

Configured in ``reward.domain_kwargs.format`` by a named ``preset`` (default ``think_answer``) or
a regular expression ``pattern``, not both. Each checks named parts, returned as sub-scores (1 or
0); the score is 1 when every part holds, else 0, or, with ``partial: true``, the fraction of
parts that hold.

``think_answer``: ``<think>...</think><answer>...</answer>``, whitespace allowed around the blocks.
  ``think`` / ``answer``: the tag opens exactly once, closes exactly once after it, and holds
  non-blank text; ``order``: both hold and the think block ends before the answer block starts;
  ``clean``: all of that and nothing but whitespace outside the two blocks.
``boxed``: a ``\\boxed{...}`` answer. ``boxed``: some ``\\boxed{`` closes (braces balanced) around
  non-blank text; ``single``: ``\\boxed`` appears exactly once (several boxes offer alternatives);
  ``final``: nothing after the box but whitespace, ``.``, ``$``, ``\\]``, ``\\)`` or ``**``.
``pattern``: ``match``: the whole response, stripped of surrounding whitespace, matches
  (``re.fullmatch`` with DOTALL); ``found``: the pattern matches somewhere in it; and for each named
  group ``(?P<name>...)`` a sub-score ``name``: the group took part in the match (the whole one,
  else the first found) with non-blank text. Only ``match`` counts towards the score: a pattern's
  parts are reported, not required separately.

What counts as gaming the format, and scores 0 here: empty blocks (``<think></think>``), a block
opened twice or never closed, an answer repeated inside the reasoning, text after the answer,
several boxes. The presets run in linear time. A custom ``pattern`` runs in the driver like the
presets: keep it free of nested quantifiers such as ``(a+)+``, which backtrack exponentially.

An unknown preset (the error lists the presets), both a preset and a pattern, or a pattern that
does not compile is an error when the run binds its reward domains, before any worker starts.
No ground truth is needed. Route it beside a correctness domain with a small weight, e.g.
``reward.domain_map: {gsm8k: {gsm8k: 1.0, format: 0.1}}``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.hookspecs import RegisterRewardDomain

__all__ = ["PRESETS", "boxed_parts", "check_config", "format_reward", "pattern_parts", "think_answer_parts"]

_TRAILING = re.compile(r"(?:\s|\.|\$|\\\]|\\\)|\*\*)*")
_BOXED = re.compile(r"\\boxed\s*\{")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (skipped) or a brace


def _block(text: str, tag: str) -> tuple[int, int] | None:
    """``(start of the opening tag, end of the closing tag)`` of the one well-formed ``<tag>`` block, else None."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    if text.count(open_tag) != 1 or text.count(close_tag) != 1:
        return None
    start, close = text.index(open_tag), text.index(close_tag)
    if close < start or not text[start + len(open_tag) : close].strip():
        return None
    return start, close + len(close_tag)


def think_answer_parts(response: str) -> dict[str, bool]:
    """The parts of the ``think_answer`` preset (see the module docstring)."""
    think, answer = _block(response, "think"), _block(response, "answer")
    order = think is not None and answer is not None and think[1] <= answer[0]
    clean = False
    if think is not None and answer is not None and order:  # nothing outside the two blocks
        clean = not (response[: think[0]] + response[think[1] : answer[0]] + response[answer[1] :]).strip()
    return {"think": think is not None, "answer": answer is not None, "order": order, "clean": clean}


def _closing_braces(text: str) -> dict[int, int]:
    """``{index of a "{": index of the "}" that closes it}`` in one pass (a box per scan would be
    quadratic on a response of many unclosed boxes); ``\\{`` and ``\\}`` are literal braces."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKENS.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif m.group() == "}" and stack:
            closes[stack.pop()] = m.start()
    return closes


def boxed_parts(response: str) -> dict[str, bool]:
    """The parts of the ``boxed`` preset (see the module docstring); the last well-formed box is the answer."""
    closes = _closing_braces(response)
    ends = []
    for m in _BOXED.finditer(response):
        close = closes.get(m.end() - 1)
        if close is not None and response[m.end() : close].strip():
            ends.append(close + 1)
    final = bool(ends) and _TRAILING.fullmatch(response, ends[-1]) is not None
    return {"boxed": bool(ends), "single": response.count("\\boxed") == 1, "final": final}


@functools.lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ValueError(f"format: pattern {pattern!r} is not a valid regular expression: {e}") from None
    for name in regex.groupindex:
        if name in ("match", "found", "score", "failures"):  # sub-scores of their own, or the RewardManager's columns
            raise ValueError(f"format: pattern group name {name!r} is taken by a sub-score; rename the group")
    return regex


def pattern_parts(response: str, pattern: str) -> dict[str, bool]:
    """The parts of a custom ``pattern`` (see the module docstring)."""
    regex = _compiled(pattern)
    whole = regex.fullmatch(response.strip())
    found = whole or regex.search(response)
    parts = {"match": whole is not None, "found": found is not None}
    for name in regex.groupindex:
        parts[name] = found is not None and bool((found.group(name) or "").strip())
    return parts


#: preset name -> function from the response to its parts
PRESETS: dict[str, Callable[[str], dict[str, bool]]] = {"think_answer": think_answer_parts, "boxed": boxed_parts}


def check_config(preset: str | None, pattern: str | None) -> None:
    """Raise ``ValueError`` for a structure that cannot be checked: both given, an unknown preset, a bad pattern."""
    if pattern is not None:
        if preset is not None:
            raise ValueError(f"format: give a preset or a pattern, not both (preset={preset!r}, pattern={pattern!r})")
        _compiled(pattern)
    elif (preset or "think_answer") not in PRESETS:
        raise ValueError(
            f"format: unknown preset {preset!r}; presets: {', '.join(sorted(PRESETS))} (or set pattern: a regular "
            "expression)"
        )


def format_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    preset: str | None = None,
    pattern: str | None = None,
    partial: bool = False,
) -> RewardResult:
    """Score whether ``response`` follows the structure (see the module docstring).

    :param preset: ``think_answer`` (the default when no ``pattern`` is given) or ``boxed``.
    :param pattern: a regular expression the whole response must match, instead of a preset.
    :param partial: score the fraction of parts that hold instead of all-or-nothing.
    """
    check_config(preset, pattern)
    if pattern is not None:
        parts = pattern_parts(response, pattern)
        scored = {"match": parts["match"]}
    else:
        parts = scored = PRESETS[preset or "think_answer"](response)
    score = sum(scored.values()) / len(scored) if partial else float(all(scored.values()))
    return RewardResult(float(score), {k: float(v) for k, v in parts.items()})


def _score_range(params: Mapping[str, Any]) -> tuple[float, float]:
    # computed when the run's reward domains are bound, before any worker starts: a misspelled
    # preset or a broken pattern is an error then, not a failed score on every row
    check_config(params["preset"], params["pattern"])
    return 0.0, 1.0


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "format",
        RewardDomain(
            format_reward,
            requires_ground_truth=False,
            inline=True,
            score_range=_score_range,
            description="response structure: preset think_answer or boxed, or a regular expression; sub-scores per "
            "part",
        ),
    )
