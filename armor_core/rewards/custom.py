"""Reward functions from a file: ``reward.custom``, verl's ``custom_reward_function`` with the signature unchanged.

    reward:
      custom:
        - {path: my_reward.py, name: compute_score, data_sources: [my_math]}

Each entry becomes a reward domain (named ``domain``, default the file's stem) that scores the rows of
its ``data_sources`` (or those ``reward.domain_map`` routes to it, with weights beside other domains).
The function is called as verl calls it, by keyword::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kwargs)

and returns a number, or a dict with ``score`` whose other numeric (or bool) values become sub-scores;
values of other types (a predicted answer as text) are left out. With ``batched: true`` it takes lists
and returns a list, as verl's batch reward manager calls it::

    compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...], **kwargs)

``kwargs`` (the entry's, or ``reward.domain_kwargs.<domain>``) are passed on. ``extra_info`` is the row's
``extra_info`` (ARMOR's ``extra``) with the response length added.

The file is read and run once on the driver when the run starts: a missing file, a syntax error, an
error while its top level runs (``sys.exit()`` included), a missing function or one that cannot take those
arguments is one line naming the file (and the line). The function's *source* then travels inside the domain, pickled,
to the reward pool's worker processes (``reward.timeout_s``, the failure watch), wherever they run:
nothing has to be copied to other machines. Its imports must be importable there, like any domain's.
"""

from __future__ import annotations

import hashlib
import inspect
import numbers
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from armor_core.config.schema import ConfigError
from armor_core.interfaces import DATA_SOURCE_KEY, RewardDomain, RewardResult
from armor_core.rewards.batch import ROW_PARAMETERS, OneRowFromBatch

__all__ = ["SOURCE_KEY", "FileFunction", "load_custom"]

#: the key under which the reward manager hands a row's data_source to a file function, in its extra
SOURCE_KEY = DATA_SOURCE_KEY
_DOMAIN_ARGS = tuple(p.name for p in ROW_PARAMETERS)
_ROW_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
_BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
_ENTRY_KEYS = ("path", "name", "domain", "data_sources", "batched", "kwargs", "requires_ground_truth")
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}  # (sha256 of the source, name) -> function, per process


class FileFunction(OneRowFromBatch):
    """A reward function read from a file, callable as a domain's ``fn``; pickled with its source."""

    wants_data_source = True  # the manager puts each row's data_source in its extra (SOURCE_KEY)

    def __init__(self, path: str, name: str, source: str, batched: bool = False) -> None:
        self.path, self.name, self.source, self.batched = path, name, source, batched
        self.fn = _load(path, name, source)
        # what check_params reads: the domain's four row arguments, then the file function's own keywords
        row = list(ROW_PARAMETERS)
        taken = {*_DOMAIN_ARGS, *(_BATCH_ARGS if batched else _ROW_ARGS)}
        try:
            own = [p for p in inspect.signature(self.fn).parameters.values() if p.name not in taken]
        except ValueError:  # no signature to read (a builtin): any keyword
            own = [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
        keyword = [p.replace(kind=p.KEYWORD_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p for p in own]
        keyword = [p for p in keyword if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
        self.__signature__ = inspect.Signature(row + keyword)

    def __reduce__(self) -> tuple:
        return FileFunction, (self.path, self.name, self.source, self.batched)

    def __repr__(self) -> str:
        return f"FileFunction({self.path}:{self.name})"

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
        **kwargs: Any,
    ) -> list[RewardResult]:
        infos = [dict(e) for e in extras]
        sources = [info.pop(SOURCE_KEY, None) for info in infos]
        if self.batched:
            out = self.fn(
                data_sources=sources, solution_strs=list(responses), ground_truths=list(ground_truths),
                extra_infos=infos, **kwargs,
            )  # fmt: skip
            if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence):
                raise TypeError(f"{self.name} in {self.path} returned a {type(out).__name__}; a batched function "
                                "returns a list with one result per row")  # fmt: skip
            if len(out) != len(responses):
                raise ValueError(f"{self.name} in {self.path} returned {len(out)} results for {len(responses)} rows")
        else:
            out = [
                self.fn(data_source=s, solution_str=r, ground_truth=g, extra_info=i, **kwargs)
                for s, r, g, i in zip(sources, responses, ground_truths, infos)
            ]
        return [_result(x, self) for x in out]


def _result(value: Any, where: FileFunction) -> RewardResult:
    """verl's return forms: a number, or a dict with ``score`` (its other numbers become sub-scores)."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(
                f"{where.name} in {where.path} returned a dict without 'score' (keys: {', '.join(map(str, value))})"
            )
        subs = {
            str(k): float(v)
            for k, v in value.items()
            if k != "score" and isinstance(v, (numbers.Real, bool)) and not isinstance(v, str)
        }
        return RewardResult(score=value["score"], sub_scores=subs)
    return RewardResult(score=value)  # the pool refuses a str or a non-finite number, naming it


def _load(path: str, name: str, source: str) -> Callable[..., Any]:
    """Run ``source`` as a module of its own (once per process) and return its ``name``."""
    key = (hashlib.sha256(source.encode()).hexdigest(), name)
    if key not in _LOADED:
        module = types.ModuleType(f"armor_custom_reward_{key[0][:12]}")
        module.__file__ = path
        sys.modules[module.__name__] = module  # dataclasses and pickling look a class's module up there
        exec(compile(source, path, "exec"), module.__dict__)
        fn = getattr(module, name, None)
        if fn is None:
            mine = [k for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__]
            defined = sorted(mine)
            raise LookupError(f"{path} defines no {name!r}; functions it defines: {', '.join(defined) or 'none'}")
        if not callable(fn):
            raise TypeError(f"{path}: {name!r} is a {type(fn).__name__}, not a function")
        _LOADED[key] = fn
    return _LOADED[key]


def _line_in(path: str, e: BaseException) -> str:
    """``path:line`` of the deepest frame of ``e``'s traceback in ``path`` (where the file went wrong)."""
    if isinstance(e, SyntaxError) and e.lineno:
        return f"{path}:{e.lineno}"
    lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__) if frame.filename == path]
    return f"{path}:{lines[-1]}" if lines else path


def _detail(e: BaseException) -> str:
    """What went wrong while the file ran, in words. A ``SystemExit`` is named as such: left to propagate, a
    file calling ``sys.exit(0)`` at import would end ``armor run`` with exit code 0 and no output."""
    if isinstance(e, SyntaxError):
        return str(e.msg)
    if isinstance(e, SystemExit):
        return (
            f"the file exits while it is read (SystemExit({e.code!r})); a reward file defines its function and "
            "must not call sys.exit() or exit() at import"
        )
    return f"{type(e).__name__}: {e}"


def _entry(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or "path" not in raw:
        raise ConfigError(f"{where}: expected a mapping with at least 'path' (and 'name', 'data_sources'), got {raw!r}")
    unknown = sorted(set(map(str, raw)) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; an entry takes {', '.join(_ENTRY_KEYS)}")
    entry = {
        "name": "compute_score",
        "domain": None,
        "data_sources": [],
        "batched": False,
        "kwargs": {},
        "requires_ground_truth": True,
        **raw,
    }
    sources = entry["data_sources"]
    if isinstance(sources, str) or not isinstance(sources, Sequence) or not all(isinstance(x, str) for x in sources):
        raise ConfigError(f"{where}.data_sources: expected a list of data_source names, got {sources!r}")
    if not isinstance(entry["kwargs"], Mapping):
        raise ConfigError(f"{where}.kwargs: expected a mapping of keyword arguments, got {entry['kwargs']!r}")
    return entry


def _signature_problem(fn: Callable[..., Any], batched: bool, kwargs: Mapping[str, Any]) -> str | None:
    args = _BATCH_ARGS if batched else _ROW_ARGS
    try:
        inspect.signature(fn).bind(**dict.fromkeys(args), **kwargs)
    except TypeError as e:
        form = "batched (lists in, a list out)" if batched else "one row a call"
        return f"cannot be called as verl calls it, {form}: {fn.__name__}({', '.join(args)}=...): {e}"
    except ValueError:  # a builtin without a signature: take it as it is
        return None
    return None


def load_custom(
    entries: Any, known: Sequence[str], where: str = "reward.custom"
) -> tuple[dict[str, RewardDomain], dict[str, str], dict[str, dict[str, Any]]]:
    """The domains of ``reward.custom``: ``({domain: RewardDomain}, {data_source: domain}, {domain: kwargs})``.

    :param known: the installed domains' names, which a custom domain may not take.
    :raises ConfigError: naming the entry, the file and the line, for anything that keeps it from scoring.
    """
    if entries is None:
        return {}, {}, {}
    if isinstance(entries, Mapping) or not isinstance(entries, Sequence) or isinstance(entries, str):
        raise ConfigError(f"{where}: expected a list of {{path, name, data_sources}} entries, got {entries!r}")
    domains: dict[str, RewardDomain] = {}
    routes: dict[str, str] = {}
    kwargs: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(entries):
        at = f"{where}[{i}]"
        entry = _entry(raw, at)
        path = Path(str(entry["path"])).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{at}.path: {path} is not a file; give a Python file that defines {entry['name']}")
        name = str(entry["domain"] or path.stem)
        if name in known or name in domains:
            taken = "an installed domain" if name in known else "another entry"
            raise ConfigError(f"{at}: the domain name {name!r} is taken ({taken}); name this one with {at}.domain=NAME")
        try:
            source = path.read_text(encoding="utf-8")
            fn = FileFunction(str(path), str(entry["name"]), source, bool(entry["batched"]))
        except (LookupError, TypeError) as e:
            raise ConfigError(f"{at}: {e}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SyntaxError, or whatever the file's top level raised: sys.exit(0) too
            raise ConfigError(f"{at}: {_line_in(str(path), e)}: {_detail(e)}") from None
        problem = _signature_problem(fn.fn, fn.batched, entry["kwargs"])
        if problem:
            line = getattr(getattr(fn.fn, "__code__", None), "co_firstlineno", None)
            raise ConfigError(f"{at}: {path}{f':{line}' if line else ''}: {entry['name']} {problem}")
        domains[name] = RewardDomain(
            fn=fn,
            batch_fn=fn.score_batch if fn.batched else None,  # a row function: each row alone, its failure its own
            requires_ground_truth=bool(entry["requires_ground_truth"]),
            description=f"{entry['name']} from {path}",
            score_range=None,
        )
        kwargs[name] = dict(entry["kwargs"])
        for source_name in entry["data_sources"]:
            if source_name in routes:
                raise ConfigError(f"{at}.data_sources: {source_name!r} is already scored by {routes[source_name]!r}")
            routes[source_name] = name
    return domains, routes, kwargs
