"""The ``reasoning_gym`` task: any dataset of the reasoning-gym library as ARMOR rows.

``data.task: reasoning_gym`` with ``data.task_kwargs: {dataset: basic_arithmetic, config: {max_terms: 3}}``
draws ``data.train_size`` training and ``data.val_size`` held-out rows from reasoning-gym's procedural
generator ``dataset`` (``reasoning_gym.create_dataset(dataset, **config)``), seeded from ``trainer.seed``
(or ``task_kwargs.data_seed``). ``curriculum: {level: 2}`` or ``curriculum: {attribute_levels: {num_terms:
1}}`` (``"*"`` for every attribute; ``mode``: ``inclusive``, ``upper_bound`` or ``last_k`` with ``k``) makes
the config from the dataset's reasoning-gym curriculum instead, the ``config`` given filling the rest.

Held out. A question belongs to ``train`` or ``test`` by a fixed hash of its text, never by the seed:
generated items whose question hashes to the other split are skipped, so no question is in both splits,
whatever the seeds and sizes (different seeds alone would not do: a small config space repeats questions).
Questions are distinct within a split while the generator yields new ones; when it stops (a small config
space), the split's questions are cycled in fresh seeded permutations, as the ``arithmetic`` task does.

Rows: ``prompt`` (the question as text, or with ``prompt_format: chat`` a system message from
reasoning-gym's ``SYSTEM_PROMPTS``, ``system_prompt``, and the question as the user message),
``data_source: reasoning_gym``, ``dataset``, and a ``ground_truth`` that is JSON text: the dataset, its
``config`` and ``curriculum``, and the entry ``{question, answer, metadata}`` that reasoning-gym's
``score_answer(answer, entry)`` reads (tuples, integer keys and numpy scalars tagged, so it decodes to what
the generator made). The ``reasoning_gym`` reward domain (``armor_plugins/rewards/reasoning_gym.py``) scores
it with that dataset's own ``score_answer``.

reasoning-gym is an optional dependency (``pip install 'armor-rl[reasoning-gym]'``): this module imports
it only when rows are made or scored, so ARMOR loads without it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from armor_core import Task, hookimpl
from armor_core.errors import UserFacingError
from armor_core.hookspecs import RegisterTask

__all__ = [
    "DATA_SOURCE",
    "TEST_FRACTION",
    "decode_ground_truth",
    "encode_entry",
    "generate_reasoning_gym",
    "library",
    "make_dataset",
    "split_of_question",
]

DATA_SOURCE = "reasoning_gym"
#: share of the questions that belongs to the test split (by the hash of their text)
TEST_FRACTION = 0.2
_SPLITS = ("train", "test")
_INSTALL = "pip install 'armor-rl[reasoning-gym]'"
# a split stops looking for new questions after this many draws in a row gave none
_PATIENCE = 2000
_TAGS = ("__tuple__", "__set__", "__items__")
_PROMPT_FORMATS = ("text", "chat")
_MODES = ("inclusive", "upper_bound", "last_k")


class ReasoningGymMissingError(UserFacingError):
    """reasoning-gym is not installed."""


def library() -> Any:
    """The ``reasoning_gym`` module, or a one-line error saying how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ReasoningGymMissingError(
            f"the reasoning_gym task and reward domain need the reasoning-gym library: {_INSTALL}"
        ) from None
    return reasoning_gym


def _registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's ``{dataset name: (dataset class, config class)}``."""
    return library().factory.DATASETS


def _unknown_dataset(name: Any, names: list[str]) -> ValueError:
    """An error naming the unknown dataset, with close names (did-you-mean)."""
    text = str(name)
    close = difflib.get_close_matches(text, names, n=5, cutoff=0.6)
    close += [n for n in names if text and text in n and n not in close][: 8 - len(close)]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(
        f"reasoning-gym has no dataset {name!r}{hint} (it has {len(names)}: "
        "python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))')"
    )


def _curriculum(name: str, curriculum: Mapping[str, Any]) -> tuple[Any, Any]:
    """The dataset's reasoning-gym curriculum at the levels asked, and the context that turns levels into ranges."""
    factory = library().factory
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

    if name not in factory.CURRICULA:
        raise ValueError(f"reasoning-gym dataset {name!r} has no curriculum; leave out curriculum and set config")
    allowed = {"level", "attribute_levels", "mode", "k"}
    if not isinstance(curriculum, Mapping) or not curriculum or set(curriculum) - allowed:
        raise ValueError(
            f"curriculum={curriculum!r} must be a mapping of {sorted(allowed)}, e.g. {{level: 2}} or "
            "{attribute_levels: {'*': 1}}"
        )
    cur = factory.create_curriculum(name)
    if "level" in curriculum:
        cur.set_global_level(int(curriculum["level"]))
    levels = dict(curriculum.get("attribute_levels") or {})
    if "*" in levels:
        cur.set_global_level(int(levels.pop("*")))
    for attr, level in levels.items():
        if attr not in cur.attributes:
            raise ValueError(
                f"curriculum of {name!r} has no attribute {attr!r}; its attributes: {', '.join(sorted(cur.attributes))}"
            )
        cur.set_attr_level(attr, int(level))
    mode = curriculum.get("mode", "inclusive")
    if mode not in _MODES:
        raise ValueError(f"curriculum mode={mode!r} must be one of {', '.join(_MODES)}")
    return cur, DefaultCurriculumContext(mode=RangeAttributeMode(mode), k=curriculum.get("k"))


def _config(name: str, config: Mapping[str, Any], curriculum: Mapping[str, Any] | None, seed: int, size: int) -> Any:
    """The dataset's config object, checked, with reasoning-gym's own ``seed`` and ``size`` set."""
    registry = _registry()
    if name not in registry:
        raise _unknown_dataset(name, sorted(registry))
    config_cls = registry[name][1]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    config = dict(config or {})
    taken = sorted({"seed", "size"} & set(config))
    if taken:
        raise ValueError(
            f"config sets {taken}: ARMOR sets them (sizes from data.train_size / data.val_size, the seed from "
            "trainer.seed or task_kwargs.data_seed)"
        )
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(
            f"reasoning-gym dataset {name!r} has no config field(s) {unknown}; its fields: "
            f"{', '.join(sorted(fields - {'seed', 'size'}))}"
        )
    cur, context = _curriculum(name, curriculum) if curriculum else (None, None)
    try:
        # the curriculum sets its attributes' fields; config fills the others
        made = cur.generate_configuration(defaults=config, context=context) if cur else config_cls(**config)
        made = dataclasses.replace(made, seed=seed, size=size)
        if callable(getattr(made, "validate", None)):
            made.validate()
    except (AssertionError, TypeError, ValueError, KeyError) as e:
        raise ValueError(f"reasoning-gym dataset {name!r} refused its config: {type(e).__name__}: {e}") from None
    return made


def make_dataset(
    name: str,
    config: Mapping[str, Any] | None = None,
    curriculum: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    size: int = 1,
) -> Any:
    """reasoning-gym's ``ProceduralDataset`` ``name`` for ``config`` (and ``curriculum``), seeded."""
    made = _config(name, config or {}, curriculum, seed, size)
    return _registry()[name][0](config=made)


@lru_cache(maxsize=64)
def _scorer(key: str) -> Any:
    spec = json.loads(key)
    return make_dataset(spec["dataset"], spec["config"], spec["curriculum"])


def split_of_question(question: str) -> int:
    """0 (train) or 1 (test): a fixed hash of the question's text, the same for any seed, size and config."""
    digest = hashlib.blake2b(question.encode("utf-8"), digest_size=8).digest()
    return int(int.from_bytes(digest, "big") / 2**64 < TEST_FRACTION)


def _encode(x: Any, where: str) -> Any:
    """``x`` as JSON values, tuples, sets and dicts with non-text keys tagged (``_decode`` undoes it)."""
    if isinstance(x, np.generic):
        x = x.item()
    if x is None or isinstance(x, bool):
        return x
    for kind in (int, float, str):  # a subclass (an enum member) as its plain value
        if isinstance(x, kind):
            return kind(x)
    if isinstance(x, list):
        return [_encode(v, where) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v, where) for v in x]}
    if isinstance(x, (set, frozenset)):
        return {"__set__": [_encode(v, where) for v in x]}
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x) and not set(_TAGS) & set(x):
            return {str(k): _encode(v, f"{where}.{k}") for k, v in x.items()}
        return {"__items__": [[_encode(k, where), _encode(v, f"{where}.{k}")] for k, v in x.items()]}
    raise TypeError(f"{where} holds a {type(x).__name__}, which the row's JSON ground truth cannot carry")


def _decode(x: Any) -> Any:
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, dict):
        if len(x) == 1 and next(iter(x)) in _TAGS:
            tag, value = next(iter(x.items()))
            if tag == "__tuple__":
                return tuple(_decode(v) for v in value)
            if tag == "__set__":
                return {_decode(v) for v in value}
            return {_decode(k): _decode(v) for k, v in value}
        return {k: _decode(v) for k, v in x.items()}
    return x


def encode_entry(entry: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """A reasoning-gym entry's ``question``, ``answer`` and ``metadata`` as JSON values."""
    return _encode({k: entry.get(k) for k in ("question", "answer", "metadata")}, f"{dataset} entry")


def decode_ground_truth(ground_truth: Any) -> tuple[str, Any, dict[str, Any]]:
    """``(dataset, its scorer, entry)`` from a row's ground truth (JSON text or the decoded mapping).

    :raises ValueError: the ground truth is not what the ``reasoning_gym`` task writes.
    """
    try:
        spec = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        name, entry = spec["dataset"], spec["entry"]
        key = json.dumps({"dataset": name, "config": spec.get("config") or {}, "curriculum": spec.get("curriculum")})
    except (TypeError, ValueError, KeyError):
        shown = str(ground_truth)[:80]
        raise ValueError(
            f"ground_truth {shown!r} is not a reasoning_gym row's (JSON with dataset and entry, as the reasoning_gym "
            "task writes it)"
        ) from None
    return name, _scorer(key), _decode(entry)


def _draw(dataset: Any, split_id: int, size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` entries of ``dataset`` whose question is in the split, distinct while new ones come."""
    found: dict[str, dict[str, Any]] = {}
    misses = 0
    for idx in range(len(dataset)):
        entry = dataset[idx]
        question = entry["question"]
        if question in found or split_of_question(question) != split_id:
            misses += 1
            if misses >= _PATIENCE:
                break
            continue
        misses = 0
        found[question] = entry
        if len(found) == size:
            return list(found.values())
    entries = list(found.values())
    if not entries:
        raise ValueError(
            f"the {_SPLITS[split_id]} split is empty: none of {idx + 1} generated questions hash into it; widen the "
            "config"
        )
    rng = np.random.default_rng([seed, split_id])
    order = np.concatenate([rng.permutation(len(entries)) for _ in range(-(-size // len(entries)))])[:size]
    return [entries[int(i)] for i in order]


def _prompt(question: str, prompt_format: str, system_prompt: str) -> str | list[dict[str, str]]:
    if prompt_format == "text":
        return question
    prompts = library().utils.SYSTEM_PROMPTS
    system = prompts.get(system_prompt, system_prompt)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _checked(split: str, size: int, dataset: Any, prompt_format: str, unknown: dict[str, Any]) -> tuple[int, str]:
    """The split's index (0 train, 1 test) and the dataset's name, once the parameters of ``generate_reasoning_gym``
    are known to be valid."""
    if unknown:
        raise TypeError(
            f"reasoning_gym task: unknown parameter(s) {sorted(unknown)}; accepted: dataset, config, curriculum, "
            "data_seed, prompt_format, system_prompt (set them in data.task_kwargs)"
        )
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    if split_key not in _SPLITS:
        raise ValueError(f"reasoning_gym task: split {split!r} is not one of 'train', 'test'")
    if not dataset or not isinstance(dataset, str):
        raise ValueError(
            "reasoning_gym task: name the reasoning-gym dataset in data.task_kwargs.dataset, e.g. basic_arithmetic"
        )
    if prompt_format not in _PROMPT_FORMATS:
        raise ValueError(f"reasoning_gym task: prompt_format={prompt_format!r} must be 'text' or 'chat'")
    if size < 0:
        raise ValueError(f"reasoning_gym task: size={size} must be >= 0")
    return _SPLITS.index(split_key), dataset


def generate_reasoning_gym(
    split: str,
    size: int,
    seed: int,
    *,
    dataset: str | None = None,
    config: Mapping[str, Any] | None = None,
    curriculum: Mapping[str, Any] | None = None,
    data_seed: int | None = None,
    prompt_format: str = "text",
    system_prompt: str = "default",
    **unknown: Any,
) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "data_source": "reasoning_gym", "dataset", "ground_truth", "response"}`` of one
    reasoning-gym dataset (``response``: the dataset's answer, ``armor sft``'s target, where it has one).

    :param split: ``train`` or ``test`` (``val`` and ``validation`` mean ``test``).
    :param size: number of rows.
    :param seed: seeds the generator (``trainer.seed``), unless ``data_seed`` is given.
    :param dataset: the reasoning-gym dataset's name, e.g. ``basic_arithmetic``.
    :param config: the dataset's config fields (reasoning-gym's ``create_dataset(dataset, **config)``), without
        ``seed`` and ``size``, which ARMOR sets.
    :param curriculum: make the config from the dataset's curriculum: ``{level: N}`` sets every attribute's
        level, ``{attribute_levels: {name: N, "*": N}}`` some; ``mode`` (``inclusive``, ``upper_bound``,
        ``last_k`` with ``k``) how a level becomes a range.
    :param data_seed: seeds the generator instead of ``trainer.seed``.
    :param prompt_format: ``text`` (the question alone, as the built-in tasks' prompts) or ``chat`` (a system
        message asking for ``<answer>...</answer>``, then the question: for chat-template models).
    :param system_prompt: with ``chat``, a name in reasoning-gym's ``SYSTEM_PROMPTS`` (``default``,
        ``DeepSeekZero``, ``simple``, ``direct``, ``chain_of_draft``) or the system message's text.
    """
    split_id, name = _checked(split, size, dataset, prompt_format, unknown)
    base = int(seed if data_seed is None else data_seed) & 0xFFFFFFFF
    rg_seed = int(np.random.SeedSequence([base, split_id]).generate_state(1)[0])
    draws = max(50 * size, 1000)  # the generator's virtual size: items are made on demand, by index
    try:
        source = make_dataset(name, config, curriculum, seed=rg_seed, size=draws)
        entries = _draw(source, split_id, size, base) if size else []
        truth = {
            "dataset": name,
            "config": dict(config or {}),
            "curriculum": dict(curriculum) if curriculum else None,
        }
        rows = [
            {
                "prompt": _prompt(e["question"], prompt_format, system_prompt),
                "data_source": DATA_SOURCE,
                "dataset": name,
                "ground_truth": json.dumps({**truth, "entry": encode_entry(e, name)}),
                **_target(e, prompt_format),
            }
            for e in entries
        ]
    except (TypeError, ValueError) as e:
        raise ValueError(f"reasoning_gym task (dataset {name!r}): {e}") from None
    return rows


def _target(entry: Mapping[str, Any], prompt_format: str) -> dict[str, str]:
    """``{"response": ...}``, the dataset's own answer as ``armor sft`` trains on it (bare, or in the answer tag
    that the ``chat`` prompts ask for); nothing for a dataset without a text answer (its checker has no oracle)."""
    answer = entry.get("answer")
    if not isinstance(answer, str):
        return {}
    return {"response": answer if prompt_format == "text" else f"<answer>{answer}</answer>"}


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register(
        DATA_SOURCE,
        Task(
            generate_reasoning_gym,
            description="any reasoning-gym dataset by name (data.task_kwargs.dataset); needs armor-rl[reasoning-gym]",
        ),
    )
