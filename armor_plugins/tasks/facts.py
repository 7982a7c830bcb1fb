"""The built-in ``facts`` task: questions about a small fictional knowledge base, in English and Chinese.

The knowledge base is made in code from ``kb_seed``: ``entities`` fictional countries (``Kamel``),
each with four facts: its capital (``Velo``), the colour of its flag (red / 红色), the year it was
founded (``1523``) and its founder (``Tiro``). Every fact can be asked in eight *cells*: a language
(``en``, ``zh``), a form, and one of two phrasings (``Kamel's capital?`` / ``Kamel: capital city?``,
``Kamel的首都？`` / ``Kamel的首都是哪座城市？``). The forms:

- ``short``: the question alone; ``data_source: short_answer``, the ground truth is the value in
  the question's language;
- ``choice``: the question followed by four options (``... A.Velo B.Tesa C.Miro D.Buna``);
  ``data_source: multiple_choice``, the row's ``options`` (``extra["options"]`` once loaded) map
  letters to texts, and the ground truth is the right option's text (``choice_answer: text``, the
  default) or its letter (``choice_answer: letter``). Distractors are the same attribute of other
  countries, and the seed draws them and their order for each row.

The rows route to the ``multiple_choice`` and ``short_answer`` reward domains of armor-rewards-qa
through ``data_source``. The ``multiple_choice`` domain accepts the right letter or the right
option's text either way. The ground truth is the text by default because that is what ``armor
sft`` trains a warm start to answer: a 1M-parameter character-level model trained on letters
stayed at chance (25%) on multiple choice after 1000 steps while it learned the short answers
(measured with an earlier, longer phrasing of the questions), whereas quoting an option is a copy
from the prompt that it learns.

Held out. The knowledge is shared between the splits and the questions are not: each fact has one
held-out cell, and the ``test`` split asks each fact only in its held-out cell, while ``train``
asks it only in the other seven. Held-out cells are dealt round-robin over a seeded shuffle of each
attribute's facts, so every cell is held out for an eighth of the facts and every question
template appears in both splits. A ``test`` question is therefore about a fact that training
teaches, in a phrasing, language and form combination that training never used *for that fact*
(Kamel's capital is tested as ``Kamel: capital city?`` and trained as ``Kamel's capital?``, in
Chinese, and as multiple choice). No prompt is in both splits: a prompt names its entity,
attribute, language, form and phrasing, and no (fact, cell) pair is in both. The split depends on
``entities`` and ``kb_seed`` only, never on the row seed, which chooses which questions are drawn,
their order and the options.

Sizes. The test split has one question per fact (``4 * entities``); asking for more rows cycles
through it in fresh permutations, so short-answer questions repeat past that while
multiple-choice ones mostly differ in their options.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from armor_core import Task, hookimpl
from armor_core.hookspecs import RegisterTask

__all__ = ["ATTRIBUTES", "CELLS", "PHRASINGS", "Fact", "generate_facts", "knowledge_base", "question"]

ATTRIBUTES = ("capital", "colour", "year", "founder")
LANGUAGES = ("en", "zh")
FORMS = ("short", "choice")
PHRASINGS = (0, 1)
#: (language, form, phrasing); a fact's held-out cell is one of these
CELLS = tuple((lang, form, phrasing) for lang in LANGUAGES for form in FORMS for phrasing in PHRASINGS)
_SPLITS = ("train", "test")
_LETTERS = "ABCD"
_DATA_SOURCE = {"short": "short_answer", "choice": "multiple_choice"}
_COLOURS = {
    "red": "红色",
    "blue": "蓝色",
    "green": "绿色",
    "yellow": "黄色",
    "white": "白色",
    "black": "黑色",
    "purple": "紫色",
    "orange": "橙色",
}
# Two phrasings of each question, short, with the country first in both languages: every character
# is a token of the char-level warm start (compute grows with them), and a name in the same place
# lets a small model share what it learns about a country between phrasings, languages and forms.
_QUESTIONS = {
    ("en", "capital"): ("{}'s capital?", "{}: capital city?"),
    ("en", "colour"): ("{}'s flag colour?", "{}: colour of its flag?"),
    ("en", "year"): ("{}'s founding year?", "{}: year founded?"),
    ("en", "founder"): ("{}'s founder?", "{}: who founded it?"),
    ("zh", "capital"): ("{}的首都？", "{}的首都是哪座城市？"),
    ("zh", "colour"): ("{}国旗的颜色？", "{}的国旗是什么颜色？"),
    ("zh", "year"): ("{}建于哪年？", "{}是哪一年建立的？"),
    ("zh", "founder"): ("{}的创始人？", "{}是谁创立的？"),
}
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_YEARS = (1100, 1900)  # founding years are drawn without repeats from [1100, 1900)
_MAX_ENTITIES = 200


@dataclass(frozen=True)
class Fact:
    """One fact: ``entity``'s ``attribute`` is ``values[language]``; asked in ``held_out`` only in ``test``."""

    entity: str
    attribute: str
    values: dict[str, str]
    held_out: tuple[str, str, int]


def _names(rng: np.random.Generator, count: int, final: bool, taken: set[str]) -> list[str]:
    """``count`` new capitalised names of two consonant-vowel syllables, plus a final consonant when
    ``final`` (countries: ``Kamel``; capitals and founders: ``Velo``), none in ``taken``."""
    out: list[str] = []
    while len(out) < count:
        letters = [
            rng.choice(list(alphabet)) for alphabet in (_CONSONANTS, _VOWELS) * 2 + ((_CONSONANTS,) if final else ())
        ]
        name = "".join(letters).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@lru_cache(maxsize=8)
def knowledge_base(entities: int = 48, kb_seed: int = 0) -> tuple[Fact, ...]:
    """The facts of the knowledge base made from ``(entities, kb_seed)``: ``4 * entities`` of them,
    entity by entity in the order of ``ATTRIBUTES``. The same arguments give the same facts."""
    if not isinstance(entities, int) or not 4 <= entities <= _MAX_ENTITIES:
        raise ValueError(f"facts task: entities={entities!r} must be an integer from 4 to {_MAX_ENTITIES}")
    rng = np.random.default_rng([int(kb_seed) & 0xFFFFFFFF, entities])
    taken: set[str] = set()
    countries = _names(rng, entities, True, taken)
    capitals = _names(rng, entities, False, taken)
    founders = _names(rng, entities, False, taken)
    colours = rng.choice(list(_COLOURS), entities).tolist()
    years = (rng.permutation(_YEARS[1] - _YEARS[0])[:entities] + _YEARS[0]).tolist()
    # deal the held-out cells round-robin over a shuffle of each attribute's facts: balanced cells
    held = {a: [CELLS[i % len(CELLS)] for i in rng.permutation(entities)] for a in ATTRIBUTES}
    facts = []
    for i, name in enumerate(countries):
        values = {
            "capital": {"en": capitals[i], "zh": capitals[i]},
            "colour": {"en": colours[i], "zh": _COLOURS[colours[i]]},
            "year": {"en": str(years[i]), "zh": str(years[i])},
            "founder": {"en": founders[i], "zh": founders[i]},
        }
        facts.extend(Fact(name, a, values[a], held[a][i]) for a in ATTRIBUTES)
    return tuple(facts)


def question(fact: Fact, language: str, phrasing: int = 0) -> str:
    """The question text of ``fact`` in ``language`` and ``phrasing`` (0 or 1), without options."""
    return _QUESTIONS[(language, fact.attribute)][phrasing].format(fact.entity)


def _options(fact: Fact, language: str, pool: list[str], rng: np.random.Generator) -> tuple[dict[str, str], str]:
    """Four options (the right value and three other values of the attribute, shuffled) and the right letter."""
    right = fact.values[language]
    others = [v for v in pool if v != right]
    texts = [right, *rng.choice(others, len(_LETTERS) - 1, replace=False).tolist()]
    order = rng.permutation(len(texts))
    options = {letter: texts[j] for letter, j in zip(_LETTERS, order)}
    return options, _LETTERS[int(np.flatnonzero(order == 0)[0])]


def _row(
    fact: Fact,
    cell: tuple[str, str, int],
    pools: dict[tuple[str, str], list[str]],
    rng: np.random.Generator,
    by_letter: bool,
) -> dict[str, Any]:
    language, form, phrasing = cell
    row: dict[str, Any] = {
        "data_source": _DATA_SOURCE[form],
        "language": language,
        "phrasing": phrasing,
        "attribute": fact.attribute,
        "entity": fact.entity,
    }
    text = question(fact, language, phrasing)
    if form == "short":
        return {"prompt": text, **row, "ground_truth": fact.values[language]}
    options, letter = _options(fact, language, pools[(language, fact.attribute)], rng)
    listed = " ".join(f"{k}.{v}" for k, v in options.items())
    truth = letter if by_letter else options[letter]
    return {"prompt": f"{text} {listed}", **row, "ground_truth": truth, "options": options}


def _choices(value: Sequence[str] | str, allowed: Sequence[str], name: str) -> list[str]:
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else [str(s) for s in value]
    bad = [s for s in items if s not in allowed]
    if not items or bad:
        raise ValueError(
            f"facts task: {name}={value!r} must name some of {', '.join(allowed)} (a list, or text such as "
            f"{','.join(allowed)!r})"
        )
    return list(dict.fromkeys(items))


def _checked_split(split: str, size: int, choice_answer: str, unknown: dict[str, Any]) -> str:
    """``split`` as ``train`` or ``test``, once the parameters of ``generate_facts`` are known to be valid."""
    if unknown:
        raise TypeError(
            f"facts task: unknown parameter(s) {sorted(unknown)}; accepted: entities, kb_seed, languages, forms, "
            "choice_answer (set them in data.task_kwargs)"
        )
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    if split_key not in _SPLITS:
        raise ValueError(f"facts task: split {split!r} is not one of 'train', 'test'")
    if size < 0:
        raise ValueError(f"facts task: size={size} must be >= 0")
    if choice_answer not in ("text", "letter"):
        raise ValueError(
            f"facts task: choice_answer={choice_answer!r} must be 'text' (the right option's text) or 'letter'"
        )
    return split_key


def generate_facts(
    split: str,
    size: int,
    seed: int,
    *,
    entities: int = 48,
    kb_seed: int = 0,
    languages: Sequence[str] | str = LANGUAGES,
    forms: Sequence[str] | str = FORMS,
    choice_answer: str = "text",
    **unknown: Any,
) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "data_source", "ground_truth", "language", "phrasing", "attribute", "entity"[, "options"]}``.

    :param split: ``train`` or ``test`` (``val`` and ``validation`` mean ``test``).
    :param size: number of rows.
    :param seed: chooses the questions drawn from the split, their order and the options.
    :param entities: countries in the knowledge base (4 facts each).
    :param kb_seed: makes the knowledge base (names, values, held-out cells); keep it equal for
        the train and test splits of one run.
    :param languages: ``en``, ``zh`` or both (a list or comma-separated text).
    :param forms: ``short`` (short answer), ``choice`` (multiple choice) or both.
    :param choice_answer: the ground truth of a multiple-choice row: the right option's ``text``
        or its ``letter``.
    """
    split_key = _checked_split(split, size, choice_answer, unknown)
    kb = knowledge_base(entities, kb_seed)
    cells = [
        (lang, form, p)
        for lang in _choices(languages, LANGUAGES, "languages")
        for form in _choices(forms, FORMS, "forms")
        for p in PHRASINGS
    ]
    if split_key == "test":
        pairs = [(f, f.held_out) for f in kb if f.held_out in cells]
    else:
        pairs = [(f, c) for f in kb for c in cells if c != f.held_out]
    if size == 0:
        return []
    if not pairs:
        raise ValueError(
            f"facts task: the {split_key} split has no questions for languages={languages!r}, forms={forms!r}; "
            "allow more cells"
        )
    pools = {
        (lang, a): sorted({f.values[lang] for f in kb if f.attribute == a}) for lang in LANGUAGES for a in ATTRIBUTES
    }
    pools.update(
        {("en", "colour"): list(_COLOURS), ("zh", "colour"): list(_COLOURS.values())}
    )  # a small base may use fewer than 4 colours
    split_id = _SPLITS.index(split_key)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, split_id, entities, int(kb_seed) & 0xFFFFFFFF])
    order = np.concatenate([rng.permutation(len(pairs)) for _ in range(-(-size // len(pairs)))])[:size]
    return [_row(fact, cell, pools, rng, choice_answer == "letter") for fact, cell in (pairs[int(i)] for i in order)]


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register(
        "facts",
        Task(
            generate_facts,
            description="questions about a fictional knowledge base (EN/ZH, short answer and multiple choice)",
        ),
    )
