"""Reward routing and scoring on the driver: which domains score a row, with what weight, under what
time limit, and what happens when a domain fails.

Routing. A row's ``data_source`` picks its domains: ``reward.domain_map[data_source]`` (a domain
name, or ``{domain: weight}`` to score one row with several domains, e.g. correctness 1.0 plus
format 0.1), else the domain of the same name. Every source is resolved when the rows are loaded
(``check_rows``), so a typo fails at start, not at step 500. ``reward.domain_kwargs[domain]`` are
keyword parameters bound to the domain's function; an unknown one is an error naming the key.

Failures. A domain that raises on a row (``sys.exit()`` included), times out, or returns a score that is
not finite, lies outside float32's range (scores are trained in float32, where 1e39 is inf) or outside its
``score_range`` gives that row ``reward.failure_score`` for that domain and is counted (``reward/failures``,
``reward/timeouts``); so does every domain of a row whose weighted sum leaves float32's range. The error and
an example row are logged once per kind of error. A training run's manager also watches the failure rate
(``reward_checks.FailureWatch``).

Ground truths. A domain may declare ``RewardDomain.validate_ground_truth``, a ``check(ground_truth,
extra)`` raising ValueError for a ground truth the domain cannot read (the math pack's refuses a
dict; ``multiple_choice`` a letter that is not among the row's options). ``check_rows`` calls it on
every row routed to the domain, so a malformed dataset fails at load, naming the row, or with
``data.skip_invalid`` the row is skipped.

Time limits. Verifiers can hang, and ``signal.alarm`` works only in the main thread of the main
interpreter, so checks run in worker processes (``armor_core.rewards.pool``) that are killed and
replaced when one check exceeds ``reward.timeout_s``. ``reward.num_workers`` processes are used,
or, with 0, one helper process started on first use. The exception is an inline domain: its
author declares it pure Python, cheap and unable to hang (the built-in task's integer check), and
it runs in the calling process, because the process hop (~0.1 ms a row) costs more than the check
itself. A domain is inline when it is registered with ``RewardDomain(..., inline=True)``; the mark is the
author's, not a ``reward.domain_kwargs`` flag, which would be the user's to set. A domain with a
``batch_fn`` gets all of a batch's rows in one worker call, under one ``reward.timeout_s``.

Files. ``reward.custom`` adds domains read from Python files with verl's signature
(``armor_core.rewards.custom``); they route like installed domains, and their ``data_sources`` route to them
(a source also in ``reward.domain_map`` is an error). ``reward.remote`` adds a reward service over HTTP the
same way (``armor_core.rewards.remote``), scored inline: its client bounds its own time. ``reward.model`` adds
classifier reward models (``armor_core.rewards.model``), batched in the pool's workers, or with ``placement:
worker`` on a Ray worker of their own that the trainer starts (``armor_core.rewards.placement``; the domain
is then inline, bounded by ``reward.timeout_s``); an entry's ``rule`` domain scores the same rows at weight 0
and ``reward/model_minus_rule`` is the mean gap. ``reward.judge`` adds generative judges
(``armor_core.rewards.judge``): a local model in the pool's workers, or an OpenAI-compatible endpoint scored
inline.

Long module: ``RewardManager`` is one object whose routing, row checks, scoring and failure accounting share its
domain table; what stands apart is already in modules of its own (``pool``, ``checks``, ``entries``, ``custom``,
``remote``, ``model``, ``judge``, ``placement``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
import pickle
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from armor_core.config.packs import missing_pack
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.interfaces import RewardDomain, capability
from armor_core.rewards.checks import FailureWatch, check_params, range_problem, resolve_score_range
from armor_core.rewards.custom import SOURCE_KEY, load_custom
from armor_core.rewards.judge import load_judges
from armor_core.rewards.model import load_models
from armor_core.rewards.pool import FLOAT32_MAX, Outcome, Pool, evaluate, evaluate_batch
from armor_core.rewards.remote import load_remote

if TYPE_CHECKING:
    from armor_core.plugins import PluginManager

__all__ = ["RewardBatch", "RewardManager", "ground_truth_of"]

logger = logging.getLogger(__name__)

_SHOWN_CHARS = 200


@dataclass
class RewardBatch:
    """The scores of one batch of B rows.

    :param scores: (B,) float32, the weighted sum over each row's domains.
    :param sub_scores: ``"<domain>/<sub>"`` -> (B,) float32, plus ``"<domain>/score"`` (the
        domain's own score, ``failure_score`` where it failed). NaN where the row has no such
        sub-score (not routed to that domain, or the domain failed on it); the metrics are nanmeans.
    :param metrics: ``reward/mean``; ``reward/failures`` and ``reward/timeouts`` (failed checks in
        this batch; timeouts are failures too); ``reward/<domain>/<sub>``, ``reward/<domain>/score``,
        ``reward/<domain>/failures``; ``reward/source/<data_source>/score``.
    :param errors: per row, what failed (``"math: TimeoutError: ..."``) or None.
    :param components: per row ``{domain: (score, weight)}`` (score as in ``sub_scores``), for
        estimators that normalise each domain separately and for ``main_scores``.
    """

    scores: np.ndarray
    sub_scores: dict[str, np.ndarray]
    metrics: dict[str, float]
    errors: list[str | None] = field(default_factory=list)
    components: list[dict[str, tuple[float, float]]] = field(default_factory=list)


@dataclass(frozen=True)
class _Bound:
    domain: RewardDomain  # its fn (and batch_fn) has the configured parameters bound
    inline: bool
    batch: bool  # scored through batch_fn, a batch's rows of this domain in one call
    wants_source: bool  # a file function (reward.custom): the row's data_source goes in its extra
    spec: bytes | None  # the pickled domain, for worker processes
    score_range: tuple[float, float] | None
    check_ground_truth: Callable[[Any, Mapping[str, Any]], None] | None  # the domain's validate_ground_truth


def ground_truth_of(row: Mapping[str, Any]) -> Any:
    """A row's ground truth: ``ground_truth``, or verl's ``reward_model.ground_truth``; None if absent."""
    gt = row.get("ground_truth")
    if gt is None and isinstance(row.get("reward_model"), Mapping):
        gt = row["reward_model"].get("ground_truth")
    return None if gt is None or (isinstance(gt, str) and not gt.strip()) else gt


# -- the manager ----------------------------------------------------------------------------------


def _check_lengths(n: int, **columns: Sequence[Any]) -> None:
    """Every column of a batch to score has one entry per prompt."""
    for name, seq in columns.items():
        if len(seq) != n:
            raise ValueError(f"RewardManager.score: {name} has {len(seq)} entries but prompts has {n}")


class RewardManager:
    """Routes rows to reward domains and scores batches. Build one per run on the driver; ``close()`` it.

    :param cfg: the ``reward`` section of the run config.
    :param pm: the plugin manager to find domains in (default: the process-wide one).
    :param watch_failures: stop with ``RewardFailureError`` when a domain fails on more than
        ``reward.max_failure_fraction`` of its rows over the last ``reward.failure_window`` batches
        (a training run); without it failures are only counted (``armor reward``).
    :raises ConfigError: a domain named in ``domain_map`` or ``domain_kwargs`` is not installed, a
        weight is not a number, or a parameter is not accepted by its domain.
    """

    def __init__(self, cfg: RewardConfig, pm: PluginManager | None = None, *, watch_failures: bool = False) -> None:
        if pm is None:
            from armor_core.plugins import get_plugin_manager

            pm = get_plugin_manager()
        self.cfg = cfg
        self._pm = pm
        self._known: list[str] = pm.names("reward_domain")
        self._custom, self._custom_routes, self._custom_kwargs = load_custom(cfg.custom, self._known)
        remote, remote_routes = load_remote(cfg.remote, [*self._known, *self._custom])
        models, model_routes, self._rules = load_models(cfg.model, [*self._known, *self._custom, *remote])
        judges, judge_routes = load_judges(cfg.judge, [*self._known, *self._custom, *remote, *models])
        for added, routes in ((remote, remote_routes), (models, model_routes), (judges, judge_routes)):
            twice = sorted(set(routes) & set(self._custom_routes))
            if twice:
                ways = "reward.custom, remote, model, judge"
                raise ConfigError(f"data_source {twice[0]!r} is routed twice ({ways}); keep one")
            self._custom.update(added)
            self._custom_routes.update(routes)
        self._known += list(self._custom)
        # the domains the config itself defines; the trainer starts workers for those placed on their own
        self.config_domains: dict[str, RewardDomain] = dict(self._custom)
        self._bound: dict[str, _Bound] = {}
        self._routes: dict[str, dict[str, float]] = {}
        self._pool: Pool | None = None
        self._lock = threading.RLock()
        self._logged: set[tuple[str, str]] = set()
        self._watch = FailureWatch(cfg.max_failure_fraction, cfg.failure_window) if watch_failures else None
        if not isinstance(cfg.domain_kwargs, Mapping):
            raise ConfigError(
                f"reward.domain_kwargs must be a mapping {{domain: {{key: value}}}}, got {cfg.domain_kwargs!r}"
            )
        for name in cfg.domain_kwargs:
            self._domain(str(name), where=f"reward.domain_kwargs.{name}")
        for source in cfg.domain_map:
            self.domains_for(str(source))

    # -- resolution ---------------------------------------------------------------------------

    def _domain(self, name: str, where: str) -> _Bound:
        bound = self._bound.get(name)
        if bound is not None:
            return bound
        if name not in self._known:
            pack = missing_pack(name, where)
            if pack:
                raise ConfigError(pack)
            close = difflib.get_close_matches(name, self._known, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}: unknown reward domain {name!r}.{hint} Known domains: "
                f"{', '.join(self._known) or 'none (install a reward pack, e.g. armor-rewards-math)'}"
            )
        domain: RewardDomain = self._custom.get(name) or self._pm.get("reward_domain", name)
        params = self.cfg.domain_kwargs.get(name) or {}
        if not isinstance(params, Mapping):
            raise ConfigError(f"reward.domain_kwargs.{name} must be a mapping of parameters, got {params!r}")
        params = {**self._custom_kwargs.get(name, {}), **params}
        check_params(name, domain.fn, params)
        inline = domain.inline
        bound_domain = domain
        if params:
            batch_fn = functools.partial(domain.batch_fn, **params) if domain.batch_fn else None
            bound_domain = dataclasses.replace(domain, fn=functools.partial(domain.fn, **params), batch_fn=batch_fn)
        spec = None
        if not inline:
            try:
                spec = pickle.dumps(bound_domain)
            except Exception as e:
                raise ConfigError(
                    f"reward domain {name!r} ({getattr(domain.fn, '__qualname__', domain.fn)!r}) cannot be sent to "
                    f"a reward worker process: {e}. Register a module-level function (not a lambda or closure), or "
                    "set register it with RewardDomain(..., inline=True) if it is pure, cheap and cannot hang"
                ) from e
        score_range = resolve_score_range(name, domain.score_range, domain.fn, params)
        bound = self._bound[name] = _Bound(
            bound_domain,
            inline,
            batch=domain.batch_fn is not None,
            wants_source=bool(capability("reward_domain", domain.fn, "wants_data_source")),
            spec=spec,
            score_range=score_range,
            check_ground_truth=domain.validate_ground_truth,
        )
        return bound

    def domain(self, name: str) -> RewardDomain:
        """The domain ``name`` with its configured parameters bound (ConfigError if not installed)."""
        return self._domain(name, where="reward domain").domain

    def domains_for(self, data_source: str) -> dict[str, float]:
        """``{domain: weight}`` for rows of ``data_source``.

        :raises ConfigError: the source maps to no installed domain; the message lists the known ones.
        """
        route = self._routes.get(data_source)
        if route is not None:
            return route
        where = f"reward.domain_map.{data_source}"
        spec = self.cfg.domain_map.get(data_source)
        custom = self._custom_routes.get(data_source)
        if spec is not None and custom is not None:
            raise ConfigError(
                f"data_source {data_source!r} is routed twice: {where}={spec!r} and reward.custom's "
                f"{custom!r} (its data_sources); keep one, or give weights in {where}"
            )
        if custom is not None:
            spec = custom
        if spec is None:
            if data_source not in self._known:
                pack = missing_pack(data_source, f"data_source {data_source!r}")
                if pack:
                    raise ConfigError(pack)
                close = difflib.get_close_matches(str(data_source), self._known, n=1, cutoff=0.5)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"data_source {data_source!r} maps to no reward domain (no reward.domain_map entry and no "
                    f"domain of that name).{hint} Known domains: {', '.join(self._known) or 'none'}. Map it with "
                    f"reward.domain_map.{data_source}=<domain>"
                )
            route = {data_source: 1.0}
        elif isinstance(spec, str):
            route = {spec: 1.0}
        elif isinstance(spec, Mapping) and spec:
            route = {}
            for name, weight in spec.items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                    raise ConfigError(f"{where}.{name}={weight!r}: a weight must be a finite number")
                route[str(name)] = float(weight)
        else:
            raise ConfigError(f"{where}={spec!r}: expected a domain name or a mapping {{domain: weight}}")
        for model, rule in self._rules.items():  # scored beside the model, moving nothing: the gap is logged
            if model in route and rule not in route:
                route = {**route, rule: 0.0}
        for name in route:
            self._domain(name, where)
        self._routes[data_source] = route
        return route

    def check_rows(self, rows: Iterable[Mapping[str, Any]], where: str, *, skip_invalid: bool = False) -> list[str]:
        """Fail now, naming ``where`` and the row, if a row's source routes nowhere, lacks a required
        ground truth, or has one a domain's ground-truth check refuses (see the module docstring).

        With ``skip_invalid`` a row whose ground truth is refused is removed from ``rows`` (then a
        list) instead, and the problems of the removed rows are returned, one each; the other
        problems stay errors. A row is located by its ``_where`` field (``"train.jsonl:12"``, as
        the data loader sets it), else its ``_line``, else its 0-based index in ``rows``.
        """
        needs_gt: dict[str, str | None] = {}  # data_source -> a domain requiring a ground truth
        gt_checks: dict[str, list[tuple[str, Any]]] = {}  # data_source -> (domain, its ground-truth check)
        missing: list[str] = []
        n_missing = 0
        kept, refused = [], []
        for i, row in enumerate(rows):
            source = row.get("data_source")
            if source is None:
                raise ConfigError(
                    f"{_locate(row, i, where)}: the row has no 'data_source' field; every row needs one to pick its "
                    "reward domain"
                )
            if source not in needs_gt:
                try:
                    route = self.domains_for(source)
                except ConfigError as e:
                    raise ConfigError(f"{_locate(row, i, where)}: {e}") from None
                needs_gt[source] = next((d for d in route if self._bound[d].domain.requires_ground_truth), None)
                gt_checks[source] = [
                    (d, self._bound[d].check_ground_truth) for d in route if self._bound[d].check_ground_truth
                ]
            domain, gt = needs_gt[source], ground_truth_of(row)
            if domain is not None and gt is None:
                n_missing += 1
                if len(missing) < 5:
                    missing.append(f"{_locate(row, i, where)} (data_source {source!r} -> domain {domain!r})")
            try:
                problem = _ground_truth_problem(gt_checks[source], gt, row.get("extra")) if gt is not None else None
            except ConfigError as e:
                raise ConfigError(f"{_locate(row, i, where)}: {e}") from None
            if problem is None:
                kept.append(row)
            elif skip_invalid:
                refused.append(f"{_locate(row, i, where)}: {problem}")
            else:
                raise ConfigError(
                    f"{_locate(row, i, where)}: {problem} (set data.skip_invalid=true to skip such rows instead)"
                )
        if n_missing:
            raise ConfigError(
                f"{where}: {n_missing} row(s) have no ground_truth but their reward domain requires one: "
                f"{'; '.join(missing)}{' ...' if n_missing > len(missing) else ''}. Add a 'ground_truth' field, or "
                "route them to a domain that needs none"
            )
        if refused and not kept:
            raise ConfigError(f"{where}: every row was skipped as invalid (data.skip_invalid=true), e.g. {refused[0]}")
        if refused:
            rows[:] = kept  # type: ignore[index]
        return refused

    def ground_truth_problem(self, data_source: str, ground_truth: Any, extra: Mapping[str, Any] | None) -> str | None:
        """What the first of ``data_source``'s domains whose ``validate_ground_truth`` refuses ``ground_truth`` says
        (the row's ``extra`` beside it), or None: the check ``check_rows`` makes on every row at load.

        :raises ConfigError: a check raised something other than ``ValueError`` (its own bug), naming the domain.
        """
        checks = [(d, self._bound[d].check_ground_truth) for d in self.domains_for(data_source)]
        return _ground_truth_problem([(d, c) for d, c in checks if c], ground_truth, extra)

    # -- scoring ------------------------------------------------------------------------------

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]] | None = None,
    ) -> RewardBatch:
        """Score B rows; every list has one entry per row (``extras`` may be None)."""
        n = len(prompts)
        extras = extras if extras is not None else [{}] * n
        _check_lengths(n, responses=responses, data_sources=data_sources, ground_truths=ground_truths, extras=extras)
        with self._lock:
            checks = [(i, d, w) for i, source in enumerate(data_sources) for d, w in self.domains_for(source).items()]
            outcomes: list[Outcome | None] = [None] * len(checks)
            jobs: list[tuple[bytes, tuple, bool]] = []
            job_checks: list[list[int]] = []  # the checks each job answers
            batched: dict[str, list[int]] = {}
            for c, (i, d, _) in enumerate(checks):
                bound, extra = self._bound[d], dict(extras[i] or {})
                if bound.wants_source:
                    extra[SOURCE_KEY] = data_sources[i]
                args = (prompts[i], responses[i], ground_truths[i], extra)
                if bound.batch:
                    batched.setdefault(d, []).append(c)
                elif bound.inline:
                    outcomes[c] = evaluate(bound.domain, *args)
                else:
                    assert bound.spec is not None  # every domain that is not inline was pickled
                    jobs.append((bound.spec, args, False))
                    job_checks.append([c])
            for d, cs in batched.items():
                rows = [checks[c][0] for c in cs]
                extra_of = [dict(extras[i] or {}) for i in rows]
                if self._bound[d].wants_source:
                    for extra, i in zip(extra_of, rows):
                        extra[SOURCE_KEY] = data_sources[i]
                args = ([prompts[i] for i in rows], [responses[i] for i in rows], [ground_truths[i] for i in rows])
                if self._bound[d].inline:  # e.g. a reward service: the client bounds its own time
                    result = evaluate_batch(self._bound[d].domain, *args, extra_of)
                    for k, c in enumerate(cs):
                        outcomes[c] = result if isinstance(result, Outcome) else result[k]
                    continue
                spec = self._bound[d].spec
                assert spec is not None  # every domain that is not inline was pickled
                jobs.append((spec, (*args, extra_of), True))
                job_checks.append(cs)
            if jobs:
                if self._pool is None:
                    self._pool = Pool(max(1, self.cfg.num_workers), self.cfg.timeout_s)
                for cs, result in zip(job_checks, self._pool.run(jobs)):
                    for k, c in enumerate(cs):  # one Outcome for a whole batch: its call failed or timed out
                        outcomes[c] = result if isinstance(result, Outcome) else result[k]
            done = [o for o in outcomes if o is not None]
            assert len(done) == len(outcomes), "a check was left without an outcome"
            return self._assemble(n, checks, done, prompts, responses, data_sources, ground_truths)

    def _assemble(
        self,
        n: int,
        checks: list[tuple[int, str, float]],
        outcomes: list[Outcome],
        prompts: Sequence[str],
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[Any],
    ) -> RewardBatch:
        scores = np.zeros(n, dtype=np.float64)
        subs: dict[str, np.ndarray] = {}
        errors: list[str | None] = [None] * n
        components: list[dict[str, tuple[float, float]]] = [{} for _ in range(n)]
        failures: Counter[str] = Counter()
        first_error: dict[str, str] = {}
        timeouts = 0

        def column(key: str) -> np.ndarray:
            if key not in subs:  # not setdefault: that would build a fresh array for every row
                subs[key] = np.full(n, np.nan, dtype=np.float32)
            return subs[key]

        for (i, d, weight), out in zip(checks, self._checked(n, checks, outcomes)):
            if out.status == "ok":
                value = out.score
                for key, sub in (out.subs or {}).items():
                    column(f"{d}/{key}")[i] = sub
            else:
                value = self.cfg.failure_score
                failures[d] += 1
                timeouts += out.status == "timeout"
                errors[i] = f"{errors[i]}; {d}: {out.message}" if errors[i] else f"{d}: {out.message}"
                first_error.setdefault(
                    d, f"{out.message} (data_source {data_sources[i]!r}, ground_truth {_shown(ground_truths[i])})"
                )
                self._log_failure(d, out, data_sources[i], prompts[i], responses[i], ground_truths[i])
            column(f"{d}/score")[i] = value
            components[i][d] = (float(np.float32(value)), weight)  # float32, as the sub-score column holds it
            scores[i] += weight * value
        metrics = self._metrics(scores, subs, failures, timeouts, checks, data_sources)
        if self._watch is not None:
            self._watch.observe(Counter(d for _, d, _ in checks), failures, first_error)
        return RewardBatch(scores.astype(np.float32), subs, metrics, errors, components)

    def _metrics(
        self,
        scores: np.ndarray,
        subs: dict[str, np.ndarray],
        failures: Counter[str],
        timeouts: int,
        checks: list[tuple[int, str, float]],
        data_sources: Sequence[str],
    ) -> dict[str, float]:
        """A scored batch's ``reward/*`` metrics: failures and timeouts, the mean score, each sub-score's mean over
        the rows that have it, each domain's failures, the model-minus-rule gap, each data source's mean."""
        n = len(scores)
        metrics: dict[str, float] = {
            "reward/failures": float(sum(failures.values())),
            "reward/timeouts": float(timeouts),
        }
        if n:
            metrics["reward/mean"] = float(scores.mean())
        for key, values in subs.items():
            finite = ~np.isnan(values)
            if finite.any():  # an all-NaN column has no mean; never put NaN in the metrics
                metrics[f"reward/{key}"] = float(values[finite].mean())
        for d in {d for _, d, _ in checks}:
            metrics[f"reward/{d}/failures"] = float(failures[d])
        gaps = [
            subs[f"{model}/score"] - subs[f"{rule}/score"]
            for model, rule in self._rules.items()
            if f"{model}/score" in subs and f"{rule}/score" in subs
        ]
        if gaps:  # rows scored by a model and its rule; failed rows count at failure_score on both sides
            gap = np.concatenate(gaps)
            if (~np.isnan(gap)).any():
                metrics["reward/model_minus_rule"] = float(np.nanmean(gap))
        sources = np.asarray(data_sources, dtype=object)
        for source in set(data_sources):
            metrics[f"reward/source/{source}/score"] = float(scores[sources == source].mean())
        return metrics

    def _checked(self, n: int, checks: list[tuple[int, str, float]], outcomes: list[Outcome]) -> list[Outcome]:
        """``outcomes`` with a score outside its domain's ``score_range`` failed, and every domain of a row whose
        weighted sum leaves float32's range (each score within it, times a weight) failed too: the sum is trained
        in float32, where it would be inf."""
        out = []
        for (_, d, _), o in zip(checks, outcomes):
            problem = range_problem(o.score, self._bound[d].score_range) if o.status == "ok" else None
            out.append(Outcome("error", kind="score_range", message=problem) if problem else o)
        totals = np.zeros(n, dtype=np.float64)
        for (i, _, weight), o in zip(checks, out):
            totals[i] += weight * o.score if o.status == "ok" else 0.0
        for c, ((i, _, _), o) in enumerate(zip(checks, out)):
            if o.status == "ok" and not abs(totals[i]) <= FLOAT32_MAX:
                message = (
                    f"the row's weighted score {totals[i]:g} is outside the float32 range (+-{FLOAT32_MAX:.4g}) "
                    "scores are trained in; return scores of a sensible size, or lower the weights"
                )
                out[c] = Outcome("error", kind="score_range", message=message)
        return out

    def _log_failure(
        self, domain: str, out: Outcome, source: str, prompt: str, response: str, ground_truth: Any
    ) -> None:
        key = (domain, out.kind)
        if key in self._logged:
            return
        self._logged.add(key)
        example = (
            f"data_source={_shown(source)} prompt={_shown(prompt)} response={_shown(response)} "
            f"ground_truth={_shown(ground_truth)}"
        )
        note = (
            f"(logged once per kind of error; each failure scores reward.failure_score={self.cfg.failure_score:g} "
            "and is counted in reward/failures)"
        )
        if out.status == "timeout":
            logger.warning("reward domain %r timed out: %s %s\n  example row: %s", domain, out.message, note, example)
        else:
            logger.error(
                "reward domain %r failed on a row: %s %s\n  example row: %s\n%s",
                domain,
                out.message,
                note,
                example,
                out.trace,
            )

    def close(self) -> None:
        """Stop the worker processes (also done when the manager is garbage-collected)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shown(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= _SHOWN_CHARS else s[:_SHOWN_CHARS] + "...'"


def _ground_truth_problem(checks: list[tuple[str, Any]], ground_truth: Any, extra: Any) -> str | None:
    """What the first domain check that refuses ``ground_truth`` says, or None."""
    for name, check in checks:
        try:
            check(ground_truth, extra or {})
        except ValueError as e:
            return f"reward domain {name!r} cannot read this ground_truth: {e}"
        except Exception as e:  # not a refusal: the check itself is broken
            raise ConfigError(
                f"reward domain {name!r}: its validate_ground_truth raised {type(e).__name__}: {e} on the ground "
                f"truth {_shown(ground_truth)}; a check raises ValueError for a ground truth the domain cannot score"
            ) from None
    return None


def _locate(row: Mapping[str, Any], index: int, where: str) -> str:
    if "_where" in row:
        return str(row["_where"])
    return f"{where}: line {row['_line']}" if "_line" in row else f"{where}: row {index}"
