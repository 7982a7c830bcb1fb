"""Text normalisation and token F1, shared by both domains, for English and Chinese.

``normalize`` is the SQuAD answer normalisation (Rajpurkar et al. 2016, its official evaluation
script: lower case, no punctuation, no articles, single spaces) extended to Chinese: NFKC first,
which turns full-width forms into half-width ones (``Ｈ２Ｏ`` -> ``H2O``, ``（`` -> ``(``) and
subscripts into digits (``H₂O`` -> ``H2O``); Chinese punctuation goes with the rest of the
punctuation; spaces next to a Chinese character are dropped (``北 京`` is ``北京``). A point or
comma inside a number is kept as the number's (``5.5`` stays ``5.5``; ``1,000`` becomes ``1000``).

``tokens`` cuts normalised text into words for F1: a run of Latin letters and digits is one token,
and each Chinese character is a token of its own (character-level F1 for Chinese, the usual
choice for Chinese reading comprehension, e.g. CMRC 2018, since word segmentation is ambiguous).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Sequence

__all__ = ["CJK", "fold", "normalize", "token_f1", "tokens"]

#: the CJK ideograph ranges used in patterns (unified, extension A, compatibility)
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_SPACE_NEAR_CJK = re.compile(rf"(?<=[{CJK}])\s+|\s+(?=[{CJK}])")
_TOKEN = re.compile(rf"[{CJK}]|[^\s{CJK}]+")
_POINT = "\x00"  # stands in for a decimal point while punctuation is removed


def fold(text: str) -> str:
    """NFKC and case folding: full-width to half-width, ``₂`` to ``2``, ``Ａ`` to ``a``."""
    return unicodedata.normalize("NFKC", text).casefold()


def _is_punct(ch: str) -> bool:
    # Unicode punctuation (P*) and symbols (S*): covers ASCII, CJK (。，、《》“”) and marks like ° and ×
    return unicodedata.category(ch)[0] in "PS"


def normalize(text: str) -> str:
    """The comparable form of an answer (see the module docstring); ``""`` for nothing left."""
    text = _DECIMAL.sub(_POINT, _THOUSANDS.sub("", fold(text)))
    text = "".join(" " if _is_punct(ch) else ch for ch in text).replace(_POINT, ".")
    text = _ARTICLES.sub(" ", text)
    return _SPACE_NEAR_CJK.sub("", " ".join(text.split()))


def tokens(text: str) -> list[str]:
    """The F1 tokens of ``text`` after ``normalize``: Latin words and single Chinese characters."""
    return _TOKEN.findall(normalize(text))


def token_f1(prediction: Sequence[str], gold: Sequence[str]) -> float:
    """SQuAD's token F1: the harmonic mean of precision and recall of the shared tokens (a multiset).

    Two empty sequences agree (1.0); one empty sequence against a non-empty one scores 0.0.
    """
    if not prediction or not gold:
        return float(not prediction and not gold)
    common = sum((Counter(prediction) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction), common / len(gold)
    return 2 * precision * recall / (precision + recall)
