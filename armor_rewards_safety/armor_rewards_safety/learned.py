"""A learned second opinion for the refusals the rules do not see, in English.

Rules catch refusals by their wording. Some refusals have none: a response that lectures about why
the request is wrong, rejects its premise ("X was not right to ...") or answers a different, harmless
question. ``RefusalModel`` is a logistic regression over the response's words and word pairs plus the
rules' own verdict (its label, apology, redirection and judgement flags, content size), trained by
``train.py`` on the ``tune`` split of XSTest's human-labelled completions (``xstest.py``).

It is consulted only for responses the rules call compliance, and only for text that is not mostly
Chinese: it can turn compliance into a refusal, never a refusal into compliance, so every rule and
hand-written case keeps its label. Inference is pure Python (a dictionary lookup per word pair);
the weights are data, ``models/refusal_en.json``.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from armor_rewards_safety.refusal import RefusalVerdict

__all__ = ["BUILTIN", "FORMAT", "RefusalModel", "features", "load_model", "mostly_chinese", "ngrams", "signals"]

BUILTIN = Path(__file__).parent / "models" / "refusal_en.json"
FORMAT = "armor-refusal-logreg/1"
_WORD = re.compile(r"[a-z]+")
_LATIN = re.compile(r"[a-z]")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def ngrams(normalized: str) -> set[str]:
    """The words and adjacent word pairs of ``normalize``-d text (letters a-z only)."""
    words = _WORD.findall(normalized)
    return set(words) | {f"{a} {b}" for a, b in zip(words, words[1:])}


def signals(normalized: str, verdict: RefusalVerdict) -> dict[str, float]:
    """What the rules saw (``refusal.RefusalVerdict``), as numeric features; sizes on a log scale near [0, 1]."""
    return {
        f"rule_{verdict.label}": 1.0,
        "apology": float(verdict.apology),
        "redirection": float(verdict.redirection),
        "judgemental": float(verdict.judgemental),
        "complies": float(verdict.complies),
        "deflection": float(verdict.deflection),
        "content": math.log1p(verdict.content_size) / 7,
        "length": math.log1p(len(normalized)) / 8,
    }


def features(normalized: str, verdict: RefusalVerdict) -> tuple[dict[str, float], set[str]]:
    """The model's inputs: rule signals and n-grams."""
    return signals(normalized, verdict), ngrams(normalized)


def mostly_chinese(normalized: str) -> bool:
    """More Chinese than English, counting a Chinese character as three letters (about one English word)."""
    return 3 * len(_CJK.findall(normalized)) > len(_LATIN.findall(normalized))


@dataclass(frozen=True)
class RefusalModel:
    """Logistic regression weights: ``bias``, one weight per signal and per n-gram, and the
    probability at or above which a response counts as refused."""

    bias: float
    signals: Mapping[str, float]
    ngrams: Mapping[str, float]
    threshold: float = 0.5
    source: str = "<memory>"
    # the weights that judge one voice or one paragraph of a response ("does this persona answer?"),
    # learned from jailbreak sets too; None: these same weights (``for_voices``)
    voices: RefusalModel | None = None

    def for_voices(self) -> RefusalModel:
        """The model that judges one part of a response: ``voices`` where the file has it, else this one."""
        return self.voices or self

    def probability(self, normalized: str, verdict: RefusalVerdict) -> float:
        """P(refused) of a ``normalize``-d response whose rule verdict is ``verdict``."""
        sig, grams = features(normalized, verdict)
        z = (
            self.bias
            + sum(self.signals.get(k, 0.0) * v for k, v in sig.items())
            + sum(self.ngrams.get(g, 0.0) for g in grams)
        )
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))

    def applies(self, normalized: str) -> bool:
        """Whether the model was trained for the text's language: English, so not mostly Chinese."""
        return not mostly_chinese(normalized)

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "<memory>") -> RefusalModel:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"{source}: not a refusal model (format {got!r}); expected format {FORMAT!r}, "
                "as written by `python -m armor_rewards_safety.train`"
            )
        try:
            threshold = float(data["threshold"])
            model = cls(
                float(data["bias"]),
                {str(k): float(v) for k, v in data["signals"].items()},
                {str(k): float(v) for k, v in data["ngrams"].items()},
                threshold,
                source,
                cls.from_dict(data["voices"], f"{source}#voices") if "voices" in data else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"{source}: malformed refusal model ({type(e).__name__}: {e}); it needs bias, threshold, "
                "signals and ngrams, as written by `python -m armor_rewards_safety.train`"
            ) from None
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"{source}: threshold {threshold} must be a probability strictly between 0 and 1")
        return model


@functools.lru_cache(maxsize=8)
def load_model(path: str | None = "builtin") -> RefusalModel | None:
    """The model at ``path``: ``"builtin"`` (the shipped ``models/refusal_en.json``), a file written by
    ``python -m armor_rewards_safety.train``, or None / ``"none"`` for rules only (returns None)."""
    if path is None or str(path).lower() == "none":
        return None
    file = BUILTIN if path == "builtin" else Path(path).expanduser()
    if not file.is_file():
        raise ValueError(
            f"learned_model {str(path)!r}: no such file; use 'builtin', null (rules only), or a model "
            "written by `python -m armor_rewards_safety.train --out FILE`"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"learned_model {str(file)!r} is not JSON: {e}") from None
    return RefusalModel.from_dict(data, str(file))
