"""The plots of ``armor report``: which metrics share an axes, and drawing them with matplotlib (Agg).

One plot is one axes with a line per (run, metric key): the key sets the colour, the run the line
style, so several runs overlay on the same axes. Every guard action is drawn where it happened: a
vertical line in the action's colour at its step (in the run's line style) and the action's marker on
each of that run's curves at that step. A non-finite value (NaN, inf) has no place on an axis: it is
a triangle on the top edge at its step. A plot whose metrics no run has is not drawn.

``draw`` returns what the figure holds, read back from its artists (not from its input), so a test
can compare what was drawn with ``metrics.jsonl``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from armor_core.report.runs import GRAD_NORM_AFTER_CLIP, Run

__all__ = ["ACTIONS", "Plot", "draw", "plan", "run_style"]

#: guard action -> (colour, marker)
ACTIONS = {
    "skip": ("#d62728", "X"),
    "scale": ("#ff7f0e", "v"),
    "adjust": ("#9467bd", "D"),
    "rollback": ("#000000", "o"),
}
_OTHER_ACTION = ("#7f7f7f", "*")
# metric colours keep clear of the action colours above
_KEY_COLORS = (
    "#1f77b4",
    "#2ca02c",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#7f7f7f",
    "#393b79",
    "#98df8a",
    "#e7ba52",
    "#006d6d",
    "#aec7e8",
    "#637939",
    "#f7b6d2",
)
_RUN_STYLES: tuple[tuple[Literal["-", "--", ":", "-."], str], ...] = (
    ("-", "solid"),
    ("--", "dashed"),
    (":", "dotted"),
    ("-.", "dash-dot"),
)
_SPARSE = 30  # a series with fewer points (a validation curve) shows them as dots
_LOG_SPAN = 1e3  # positive values spanning more than this factor get a log axis


@dataclass(frozen=True)
class Plot:
    name: str  # file stem
    title: str
    ylabel: str
    keys: tuple[str, ...]
    note: str = ""


Selector = Callable[[set], list]


def _present(*names: str) -> Selector:
    return lambda keys: [n for n in names if n in keys]


def _matching(pattern: str) -> Selector:
    rx = re.compile(pattern)
    return lambda keys: sorted(k for k in keys if rx.fullmatch(k))


def _heldout(keys: set) -> list:
    """``val/acc_<mode>``, ``val/<data_source>/acc_<mode>``, and any ``@n`` statistic (mean@n, best@n, maj@n)."""
    chosen = [k for k in keys if k.startswith("val/") and (k.rsplit("/", 1)[-1].startswith("acc") or "@" in k)]
    return sorted(chosen, key=lambda k: (k.count("/"), k))


def _train_score(keys: set) -> list:
    return _present("critic/score/mean")(keys) + _matching(r"reward/source/[^/]+/score")(keys)


_HEAD = [
    ("heldout_accuracy", "Held-out accuracy", "accuracy", _heldout, "Validation on the held-out prompts."),
    (
        "train_score",
        "Training score",
        "mean score",
        _train_score,
        "critic/score/mean: over all of the step's responses; reward/source/*: per data_source.",
    ),
]
_TAIL = [
    (
        "kl",
        "KL divergence",
        "KL",
        _matching(r"actor/(ppo_kl\w*|kl_loss|reward_kl)"),
        "actor/ppo_kl*: between the policy being updated and the one that generated the batch; actor/kl_loss, "
        "actor/reward_kl: to the reference model.",
    ),
    ("entropy", "Policy entropy", "nats per token", _present("actor/entropy"), ""),
    ("clip_fraction", "Clip fractions", "fraction of tokens", _matching(r"(actor|critic)/\w*clipfrac\w*"), ""),
    (
        "grad_norm",
        "Gradient norm",
        "L2 norm",
        _present("actor/grad_norm", GRAD_NORM_AFTER_CLIP, "critic/grad_norm"),
        f"actor/grad_norm is measured before clipping; {GRAD_NORM_AFTER_CLIP} = min(actor/grad_norm, "
        "actor.grad_clip from config.json).",
    ),
    ("response_length", "Response length", "tokens", _present("response_length/mean", "response_length/max"), ""),
    (
        "response_clipped",
        "Responses cut at rollout.response_length",
        "fraction of responses",
        _present("response_length/clip_ratio"),
        "",
    ),
    ("learning_rate", "Learning rate", "learning rate", _present("actor/lr"), ""),
    (
        "step_time",
        "Seconds per step by stage",
        "seconds",
        lambda keys: _present("timing_s/step")(keys) + _matching(r"timing_s/(?!step$).+")(keys),
        "timing_s/step is the whole step; the others are its stages.",
    ),
    (
        "logprob_diff",
        "Rollout vs trainer log-prob difference",
        "|log p rollout - log p trainer|",
        _present("rollout/logprob_diff_mean", "rollout/logprob_diff_max"),
        "Per token, over the step's responses.",
    ),
]


def run_style(index: int) -> tuple[Literal["-", "--", ":", "-."], str]:
    """The line style of the ``index``-th run: matplotlib's code and its name."""
    return _RUN_STYLES[index % len(_RUN_STYLES)]


def plan(runs: Sequence[Run]) -> tuple[list[Plot], list[str]]:
    """The plots some run has metrics for, in page order, and the titles of those none has."""
    keys = {k for run in runs for k in run.metrics}
    plots, missing = [], []
    for name, title, ylabel, select, note in [*_HEAD, *_domain_specs(keys), *_TAIL]:
        chosen = tuple(select(keys))
        if chosen:
            plots.append(Plot(name, title, ylabel, chosen, note))
        else:
            missing.append(title)
    return plots, missing


def _domain_specs(keys: set) -> list:
    """One plot per reward domain with its sub-scores (``reward/<domain>/<sub-score>``), and the reward model's
    gap to its rule where a run logs it."""
    domains = sorted(
        {m.group(1) for k in keys if (m := re.fullmatch(r"reward/([^/]+)/([^/]+)", k)) and m.group(1) != "source"}
    )
    gap = [  # only for runs with a reward model and its rule: absent elsewhere, not a missing plot
        (
            "model_minus_rule",
            "Reward model minus rule",
            "model score - rule score",
            _present("reward/model_minus_rule"),
            "reward.model's score minus its rule domain's on the same rows (mean): a rising gap is the policy "
            "pleasing the model where the rule disagrees, i.e. reward hacking.",
        )
    ]
    return gap * ("reward/model_minus_rule" in keys) + [
        (
            f"train_score_{d}",
            f"Training reward: {d}",
            "mean over responses",
            _matching(rf"reward/{re.escape(d)}/(?!failures$)[^/]+"),
            f"The {d} reward domain's score and sub-scores, over the step's responses.",
        )
        for d in domains
    ]


def draw(plot: Plot, runs: Sequence[Run], path: Path) -> dict[str, Any]:
    """Draw ``plot`` for ``runs`` into the PNG ``path``; returns what the axes hold."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for ri, run in enumerate(runs):
        style = run_style(ri)[0]
        drawn = {key: _draw_series(ax, run, ri, key, ki, style) for ki, key in enumerate(plot.keys)}
        _draw_events(ax, run, ri, style, drawn)
    ax.set_title(plot.title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(plot.ylabel)
    ax.grid(alpha=0.3)
    if _wants_log(ax):
        ax.set_yscale("log")
    out = _read_back(ax, runs)
    values = {v for s in out["series"] for v in s["values"]}
    out["constant"] = (
        values.pop() if len(values) == 1 else None
    )  # said in the caption: a flat line at 0 looks like a bug
    out["same_as"] = _same_as(out["series"], plot.keys)
    ax.legend(
        handles=_legend(out, plot.keys, runs), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )
    fig.savefig(path, format="png", bbox_inches="tight")
    return {
        "title": plot.title,
        "file": path.name,
        "ylabel": plot.ylabel,
        "note": plot.note,
        "yscale": ax.get_yscale(),
        **out,
    }


def _draw_series(ax: Any, run: Run, ri: int, key: str, ki: int, style: str) -> dict[int, float]:
    """The run's finite points of ``key`` as a line, its non-finite ones on the top edge; returns the finite points."""
    steps, values = run.series(key)
    finite = {s: v for s, v in zip(steps, values) if math.isfinite(v)}
    color = _KEY_COLORS[ki % len(_KEY_COLORS)]
    if finite:
        sparse = len(finite) < _SPARSE
        # earlier keys are drawn wider, so a series equal to a later one (val/acc_greedy with one data
        # source, a score equal to its correctness) shows as a band around it rather than vanishing
        ax.plot(
            list(finite),
            list(finite.values()),
            color=color,
            linestyle=style,
            linewidth=max(1.2, 2.6 - 0.5 * ki),
            marker="o" if sparse else None,
            markersize=3,
            gid=f"series\t{ri}\t{key}",
        )
    bad = [s for s, v in zip(steps, values) if not math.isfinite(v)]
    if bad:
        ax.scatter(
            bad,
            [1.0] * len(bad),
            transform=ax.get_xaxis_transform(),
            marker="^",
            s=30,
            color=color,
            clip_on=False,
            zorder=4,
            gid=f"nonfinite\t{ri}\t{key}",
        )
    return finite


def _draw_events(ax: Any, run: Run, ri: int, style: str, drawn: dict[str, dict[int, float]]) -> None:
    for step, action in dict.fromkeys((e["step"], e["action"]) for e in run.events):
        color, marker = ACTIONS.get(action, _OTHER_ACTION)
        ax.axvline(step, color=color, linestyle=style, linewidth=1.0, alpha=0.5, zorder=1, gid=f"event\t{ri}\t{action}")
        for key, points in drawn.items():
            if step in points:
                ax.scatter(
                    [step],
                    [points[step]],
                    marker=marker,
                    s=45,
                    color=color,
                    edgecolors="white",
                    linewidths=0.5,
                    zorder=5,
                    gid=f"mark\t{ri}\t{action}\t{key}",
                )


def _wants_log(ax: Any) -> bool:
    values = [v for line in ax.get_lines() if str(line.get_gid()).startswith("series") for v in line.get_ydata()]
    return bool(values) and min(values) > 0 and max(values) / min(values) > _LOG_SPAN


def _read_back(ax: Any, runs: Sequence[Run]) -> dict[str, Any]:
    """Series, guard-event lines, markers and non-finite points, from the axes' artists."""
    series: dict[tuple[str, str], dict[str, Any]] = {}
    events, marks = [], []
    for line in ax.get_lines():
        kind, ri, *rest = str(line.get_gid()).split("\t")
        label = runs[int(ri)].label
        if kind == "series":
            series[(label, rest[0])] = {
                "run": label,
                "key": rest[0],
                "linestyle": line.get_linestyle(),
                "steps": [int(x) for x in line.get_xdata()],
                "values": [float(y) for y in line.get_ydata()],
                "nonfinite_steps": [],
            }
        elif kind == "event":
            events.append({"run": label, "action": rest[0], "step": int(line.get_xdata()[0])})
    for coll in ax.collections:
        kind, ri, *rest = str(coll.get_gid()).split("\t")
        label, (x, y) = runs[int(ri)].label, coll.get_offsets()[0]
        if kind == "mark":
            marks.append({"run": label, "action": rest[0], "key": rest[1], "step": int(x), "value": float(y)})
        elif kind == "nonfinite":
            entry = series.setdefault(
                (label, rest[0]),
                {"run": label, "key": rest[0], "linestyle": None, "steps": [], "values": [], "nonfinite_steps": []},
            )
            entry["nonfinite_steps"] = [int(x) for x, _ in coll.get_offsets()]
    return {"series": list(series.values()), "events": events, "marks": marks}


def _legend(out: dict[str, Any], keys: Iterable[str], runs: Sequence[Run]) -> list:
    from matplotlib.lines import Line2D

    shown, same = {s["key"] for s in out["series"]}, out["same_as"]
    handles = [
        Line2D([], [], color=_KEY_COLORS[i % len(_KEY_COLORS)], label=f"{k} (= {same[k]})" if k in same else k)
        for i, k in enumerate(keys)
        if k in shown
    ]
    if len(runs) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=run_style(i)[0], label=r.label) for i, r in enumerate(runs)]
    for action in dict.fromkeys(e["action"] for e in out["events"]):
        color, marker = ACTIONS.get(action, _OTHER_ACTION)
        handles.append(
            Line2D([], [], color=color, marker=marker, linestyle="-", linewidth=1.0, label=f"guard: {action}")
        )
    if any(s["nonfinite_steps"] for s in out["series"]):
        handles.append(Line2D([], [], color="0.3", marker="^", linestyle="none", label="non-finite value"))
    return handles


def _same_as(series: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, str]:
    """Keys whose curve equals an earlier key's in every run, which it covers (a one-source run's
    val/<source>/acc_greedy is val/acc_greedy): the legend says so."""
    curves: dict[str, dict[str, tuple]] = {}
    for s in series:
        curves.setdefault(s["key"], {})[s["run"]] = (s["steps"], s["values"], s["nonfinite_steps"])
    order = [k for k in keys if k in curves]
    same = {k: next((first for first in order[:i] if curves[first] == curves[k]), None) for i, k in enumerate(order)}
    return {k: first for k, first in same.items() if first is not None}
