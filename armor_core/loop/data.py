"""Datasets: rows from JSONL / Parquet files or a built-in task, checked before any worker starts.

A row is ``{prompt, data_source, ground_truth, ...}``; ``prompt`` is text or a list of chat messages
(``[{"role": ..., "content": ...}]``). verl's layout is accepted too: ``reward_model.ground_truth``
and ``extra_info``. Every problem is reported with the file, the line (1-based, JSONL) or row
(0-based, Parquet) and the field; with ``data.skip_invalid=true`` bad rows are skipped and counted (a line that is not
UTF-8 is a bad row; a ``.parquet`` file that cannot be read is skipped whole and counted as one).

``PromptLoader`` yields seeded, shuffled batches of encoded prompts as DataProto and can save and
restore its position, so a resumed run sees the same data order it would have seen.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from armor_core.ops.sample_seeds import SEED_KEY, row_seeds

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from armor_core.config.schema import ArmorConfig
    from armor_core.plugins import PluginManager
    from armor_core.rewards.manager import RewardManager

__all__ = ["DataError", "Dataset", "PromptLoader", "load_data", "load_rows", "normalize_row", "prepare_data"]


class DataError(ValueError):
    """Bad input data; the message names the file, the line or row, and the field."""


@dataclass
class Dataset:
    rows: list[dict[str, Any]]
    source: str
    skipped: int = 0
    dropped_too_long: int = 0
    problems: list[str] = field(default_factory=list)
    encoded: dict[str, Any] = field(default_factory=dict)  # the rows tokenized (``prepare_data``), empty before


def _read_file(path: Path) -> Iterable[tuple[str, Any]]:
    """Yield (location, raw row) for each row of a JSONL or Parquet file; a problem is yielded as a
    ``DataError`` in place of its row (a file that cannot be read at all, as one for the file)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, "rb") as fh:  # decoded line by line: a bad byte is reported on its line
            for lineno, raw in enumerate(fh, 1):
                where = f"{path}, line {lineno}"
                try:
                    line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    yield (
                        where,
                        DataError(
                            f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x}, the line's byte {e.start + 1}); "
                            "save the file as UTF-8"
                        ),
                    )
                    continue
                if not line.strip():
                    continue
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as e:
                    yield where, DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            yield f"{path}", DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})")
            return
        for i, row in enumerate(rows):
            yield f"{path}, row {i}", row
    else:
        raise DataError(f"{path}: unsupported data file type {suffix!r}; use .jsonl or .parquet")


def normalize_row(raw: Any, where: str, prompt_key: str = "prompt") -> dict[str, Any]:
    """Check one raw row and return ``{prompt, data_source, ground_truth, extra}``."""
    if isinstance(raw, DataError):
        raise raw
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be a JSON object, got {type(raw).__name__}")
    if prompt_key not in raw:
        raise DataError(f"{where}: missing field '{prompt_key}' (fields present: {sorted(raw)})")
    prompt = raw[prompt_key]
    if isinstance(prompt, np.ndarray):  # Parquet list columns
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: field '{prompt_key}' is empty")
    elif isinstance(prompt, list):
        if not prompt or not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise DataError(f"{where}: field '{prompt_key}' is a list but not of chat messages {{role, content}}")
    else:
        raise DataError(
            f"{where}: field '{prompt_key}' must be text or a list of chat messages, got {type(prompt).__name__}"
        )
    if "data_source" not in raw or not isinstance(raw["data_source"], str):
        raise DataError(
            f"{where}: missing or non-text field 'data_source' (it names the reward domain that scores the row)"
        )
    gt = raw.get("ground_truth")
    rm = raw.get("reward_model")
    if gt is None and isinstance(rm, dict):  # verl's layout
        gt = rm.get("ground_truth")
    extra = dict(raw.get("extra_info") or {})
    for k, v in raw.items():
        if k not in (prompt_key, "data_source", "ground_truth", "reward_model", "extra_info"):
            extra.setdefault(k, v)
    return {"prompt": prompt, "data_source": raw["data_source"], "ground_truth": gt, "extra": extra, "_where": where}


def load_rows(
    files: list[str], *, skip_invalid: bool = False, prompt_key: str = "prompt", needs_ground_truth=None
) -> Dataset:
    """Read and check every row of ``files``.

    :param needs_ground_truth: ``fn(data_source) -> bool``; rows routed to a domain that needs a
        ground truth and lacking one are rejected here.
    """
    if not files:
        raise DataError("no data files given")
    ds = Dataset(rows=[], source=", ".join(map(str, files)))
    for f in files:
        path = Path(f)
        if path.is_dir():
            raise DataError(
                f"data file {str(path)!r} is a directory; name the JSONL or Parquet files in it (a list is allowed)"
            )
        if not path.is_file():
            raise DataError(f"data file {str(path)!r} does not exist")
        for where, raw in _read_file(path):
            try:
                row = normalize_row(raw, where, prompt_key)
                if (
                    row["ground_truth"] is None
                    and needs_ground_truth is not None
                    and needs_ground_truth(row["data_source"])
                ):
                    raise DataError(
                        f"{where}: missing 'ground_truth' (or reward_model.ground_truth), required by the reward "
                        f"domain for data_source {row['data_source']!r}"
                    )
            except DataError as e:
                if not skip_invalid:
                    raise DataError(f"{e} (set data.skip_invalid=true to skip bad rows and files instead)") from None
                ds.skipped += 1
                ds.problems.append(str(e))
                continue
            ds.rows.append(row)
    if not ds.rows:
        raise DataError(
            f"{ds.source}: the dataset is empty" + (f" after skipping {ds.skipped} invalid rows" if ds.skipped else "")
        )
    return ds


def task_rows(pm: PluginManager, task: str, split: str, size: int, seed: int, params: dict) -> Dataset:
    from armor_core.interfaces import call_with_params

    fn = pm.get("task", task, where="data.task").fn
    try:
        raw = call_with_params(fn, split, size, seed, available={}, extra=params, where=f"data.task={task}")
    except (TypeError, ValueError) as e:  # a task checks its parameters, which are the user's data.task_kwargs
        raise DataError(f"data.task={task} with data.task_kwargs={dict(params)}: {e}") from None
    rows = [normalize_row(r, f"task {task} ({split}) row {i}") for i, r in enumerate(raw)]
    if not rows:
        raise DataError(f"task {task!r} produced no rows for split {split!r}")
    return Dataset(rows=rows, source=f"task:{task}/{split}")


class PromptLoader:
    """Seeded epochs of shuffled batches; ``state_dict`` records the position for resume."""

    def __init__(
        self, encoded: dict[str, Any], batch_size: int, *, shuffle: bool, seed: int, sample_seeds: bool = True
    ) -> None:
        self.encoded = encoded  # tensors + non-tensor columns over the whole dataset, see encode_dataset
        self.n = len(encoded["non_tensors"]["uid"])
        if self.n < batch_size:
            raise DataError(f"the dataset has {self.n} usable rows, fewer than data.train_batch_size={batch_size}")
        self.batch_size, self.shuffle, self.seed, self.sample_seeds = batch_size, shuffle, seed, sample_seeds
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    @property
    def next_starts_epoch(self) -> bool:
        """Whether ``next_batch`` will start a new epoch (the rest of this one is a ragged tail, dropped)."""
        return self.position + self.batch_size > self.n

    def next_batch(self):
        from armor_core.dataproto.protocol import DataProto

        if self.next_starts_epoch:  # drop the ragged tail, start a new epoch
            self.epoch += 1
            self.position = 0
            self._order = self._make_order()
        idx = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        tensors = {k: v[idx] for k, v in self.encoded["tensors"].items()}
        non_tensors = {k: v[idx] for k, v in self.encoded["non_tensors"].items()}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)

    def next_samples(self, n: int):
        """``next_batch`` with each row repeated ``n`` times interleaved (a, a, b, b), every copy with its own
        ``sample_seed`` from (``trainer.seed``, epoch, the row's dataset index, its sample index):
        ``armor_core.ops.sample_seeds``."""
        batch = self.next_batch().repeat(n, interleave=True)
        if self.sample_seeds:  # rollout.per_sample_seeds
            batch[SEED_KEY] = row_seeds(self.seed, self.epoch, batch.non_tensors["uid"][::n], n)
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()


def _check_chat_template_kwargs(tokenizer: PreTrainedTokenizerBase, kwargs: Mapping[str, Any]) -> None:
    """Refuse ``data.apply_chat_template_kwargs`` that would silently do nothing: a name that is
    neither an ``apply_chat_template`` parameter nor read by the tokenizer's template (a typo, or
    a switch another model's template has), and ``tokenize``, which ARMOR sets itself."""
    if "tokenize" in kwargs:
        raise DataError(
            "data.apply_chat_template_kwargs.tokenize: ARMOR renders the template to text and tokenises it itself; "
            "remove the key"
        )
    template = (
        tokenizer.chat_template
        if isinstance(tokenizer.chat_template, str)
        else " ".join(dict(tokenizer.chat_template or {}).values())
    )
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    unread = [k for k in kwargs if k not in params and not re.search(rf"\b{re.escape(k)}\b", template)]
    if unread:
        raise DataError(
            f"data.apply_chat_template_kwargs: {', '.join(map(repr, unread))}: not read by this tokenizer's chat "
            "template and not a parameter of apply_chat_template, so it would change nothing; check the spelling "
            "against the template (chat_template in tokenizer_config.json)"
        )


def encode_dataset(
    ds: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int,
    truncation: str,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenise every prompt once (left-padded to the longest kept prompt); drop or cut long ones.
    Chat-message prompts go through the tokenizer's chat template with ``chat_template_kwargs``."""
    from armor_core.models.loading import encode_prompts

    prompts = [r["prompt"] for r in ds.rows]
    if (
        chat_template_kwargs
        and getattr(tokenizer, "chat_template", None)
        and any(not isinstance(p, str) for p in prompts)
    ):
        _check_chat_template_kwargs(tokenizer, chat_template_kwargs)
    try:
        input_ids, attention_mask, position_ids, kept = encode_prompts(
            tokenizer, prompts, max_prompt_length, truncation, chat_template_kwargs
        )
    except ValueError as e:
        raise DataError(f"{ds.source}: {e}") from e
    ds.dropped_too_long = len(prompts) - len(kept)
    rows = [ds.rows[i] for i in kept]
    if not rows:
        raise DataError(f"{ds.source}: every prompt is longer than data.max_prompt_length={max_prompt_length}")
    obj = lambda xs: np.array(xs + [None], dtype=object)[:-1]  # noqa: E731 - keeps lists/dicts as objects
    return {
        "tensors": {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        "non_tensors": {
            "raw_prompt": obj([r["prompt"] if isinstance(r["prompt"], str) else json.dumps(r["prompt"]) for r in rows]),
            "data_source": obj([r["data_source"] for r in rows]),
            "ground_truth": obj([r["ground_truth"] for r in rows]),
            "extra": obj([r["extra"] for r in rows]),
            "uid": np.array(kept, dtype=np.int64),
        },
    }


def prompt_template_kwargs(cfg: ArmorConfig, pm: PluginManager) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs``, under what a multi-turn environment asks the prompts to carry: its
    ``prompt_kwargs(**environment_kwargs)`` (the ``tools`` environment's function schemas, rendered into the
    system prompt by the chat template). The user's own keys win."""
    kwargs = dict(cfg.data.apply_chat_template_kwargs)
    mt = cfg.rollout.multi_turn
    if not mt.enable:
        return kwargs
    from armor_core.interfaces import capability

    env_cls = pm.get("environment", mt.environment, where="rollout.multi_turn.environment")
    hook = capability("environment", env_cls, "prompt_kwargs")
    return {**(hook(**dict(mt.environment_kwargs)) if hook is not None else {}), **kwargs}


def prepare_data(
    cfg: ArmorConfig,
    pm: PluginManager | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    rewards: RewardManager | None = None,
) -> tuple[Dataset, Dataset | None]:
    """The run's train and validation rows (``data.train_files`` / ``val_files``, or ``data.task``),
    checked against their reward domains and encoded; every problem is reported before workers start."""
    from armor_core.models.loading import load_tokenizer, resolve_model_path
    from armor_core.plugins import get_plugin_manager
    from armor_core.rewards.manager import RewardManager as _RewardManager

    pm = pm or get_plugin_manager()
    tokenizer = tokenizer or load_tokenizer(
        cfg.model.tokenizer_path or resolve_model_path(cfg.model.path), trust_remote_code=cfg.model.trust_remote_code
    )
    own_rewards = rewards is None
    rewards = rewards or _RewardManager(cfg.reward, pm)
    d = cfg.data
    try:

        def needs_gt(source: str) -> bool:
            return any(pm.get("reward_domain", name).requires_ground_truth for name in rewards.domains_for(source))

        if d.train_files:
            train = load_rows(
                d.train_files, skip_invalid=d.skip_invalid, prompt_key=d.prompt_key, needs_ground_truth=needs_gt
            )
        else:
            assert d.task is not None  # the config check requires data.train_files or data.task
            train = task_rows(pm, d.task, "train", d.train_size, cfg.trainer.seed, d.task_kwargs)
        if d.val_files:
            val = load_rows(
                d.val_files, skip_invalid=d.skip_invalid, prompt_key=d.prompt_key, needs_ground_truth=needs_gt
            )
        elif not d.train_files and d.task:
            val = task_rows(pm, d.task, "test", d.val_size, cfg.trainer.seed, d.task_kwargs)
        else:
            val = None
        for ds in (train, val):
            if ds is not None:
                refused = rewards.check_rows(
                    ds.rows, ds.source, skip_invalid=d.skip_invalid
                )  # ground truths a domain cannot read
                ds.skipped, ds.problems = ds.skipped + len(refused), ds.problems + refused
                ds.encoded = encode_dataset(
                    ds, tokenizer, d.max_prompt_length, d.truncation, prompt_template_kwargs(cfg, pm)
                )  # type: ignore[attr-defined]
    finally:
        if own_rewards:
            rewards.close()
    return train, val


def load_data(
    cfg: ArmorConfig, pm: PluginManager, tokenizer: PreTrainedTokenizerBase, rewards: RewardManager
) -> tuple[Dataset, Dataset | None, PromptLoader]:
    """A run's train and validation rows (``prepare_data``, each dataset's dropped and skipped rows reported) and
    the ``PromptLoader`` over the train rows."""
    train_ds, val_ds = prepare_data(cfg, pm, tokenizer, rewards)
    for ds in (train_ds, val_ds):
        if ds is not None and (ds.dropped_too_long or ds.skipped):
            print(
                f"{ds.source}: {len(ds.encoded['non_tensors']['uid'])} rows used; {ds.dropped_too_long} dropped "
                f"as longer than data.max_prompt_length={cfg.data.max_prompt_length}, {ds.skipped} skipped as "
                "invalid"
            )
    loader = PromptLoader(
        train_ds.encoded,
        cfg.data.train_batch_size,
        shuffle=cfg.data.shuffle,
        seed=cfg.trainer.seed,
        sample_seeds=cfg.rollout.per_sample_seeds,
    )
    return train_ds, val_ds, loader
