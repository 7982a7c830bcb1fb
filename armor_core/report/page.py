"""The HTML page of ``armor report``: one file that needs nothing else.

The PNGs are embedded as base64 data URIs (the page can be mailed or archived alone; the PNG files
next to it are the same images), the style sheet is inline, and there is no script, web font or
link to anything outside the file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Sequence

from armor_core.report.plots import run_style
from armor_core.report.runs import Run

__all__ = ["render"]

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1em 0 2em; }
figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; }
.note { color: #8a4b00; }
"""


def render(runs: Sequence[Run], plots: dict[str, dict[str, Any]], missing: Sequence[str], out_dir: Path) -> str:
    """The page: the runs, every plot (embedded from its PNG in ``out_dir``), the guard's events."""
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f"<title>ARMOR report: {_e(', '.join(r.label for r in runs))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>ARMOR run report</h1>",
        _runs_table(runs),
    ]
    if missing:
        parts.append(f"<p>Not drawn (no run has these metrics): {_e(', '.join(missing))}.</p>")
    for name, plot in plots.items():
        data = base64.b64encode((out_dir / plot["file"]).read_bytes()).decode("ascii")
        caption = " ".join(
            filter(
                None,
                [
                    _e(plot["note"]),
                    "Log scale." if plot["yscale"] == "log" else "",
                    f"Every value drawn is {plot['constant']:g}." if plot["constant"] is not None else "",
                    f"File: {_e(plot['file'])}.",
                ],
            )
        )
        parts.append(
            f'<figure id="{_e(name)}"><h2>{_e(plot["title"])}</h2>'
            f'<img src="data:image/png;base64,{data}" alt="{_e(plot["title"])}" data-file="{_e(plot["file"])}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    parts += [_events_table(runs), "</body></html>\n"]
    return "\n".join(parts)


def _runs_table(runs: Sequence[Run]) -> str:
    rows = []
    for i, run in enumerate(runs):
        status = "finished" if run.finished else "not finished"
        notes = "".join(f'<div class="note">{_e(n)}</div>' for n in run.notes)
        guard = "guard off" if (run.config.get("guard") or {}).get("enable") is False else str(len(run.events))
        rows.append(
            f"<tr><td>{_e(run.label)}</td><td>{run_style(i)[1]}</td><td>{_e(str(run.path))}</td>"
            f"<td>{run.last_step if run.last_step is not None else '-'}</td><td>{status}</td><td>{guard}</td>"
            f"<td>{notes}</td></tr>"
        )
    head = (
        "<tr><th>run</th><th>line</th><th>directory</th><th>last step</th><th>status</th>"
        "<th>guard events</th><th>notes</th></tr>"
    )
    return f"<h2>Runs</h2><table>{head}{''.join(rows)}</table>"


def _events_table(runs: Sequence[Run]) -> str:
    rows = []
    for run in runs:
        for e in run.events:
            rows.append(
                f"<tr><td>{_e(run.label)}</td><td>{e['step']}</td><td>{_e(str(e.get('stage', '')))}</td>"
                f"<td>{_e(str(e.get('guard', '')))}</td><td>{_e(str(e['action']))}</td>"
                f"<td>{_e(str(e.get('reason', '')))}</td><td>{_e(_fmt(e.get('signal')))}</td>"
                f"<td>{_e(_fmt(e.get('threshold')))}</td><td>{_e(_detail(e))}</td></tr>"
            )
    if not rows:
        return (
            '<h2 id="guard-events">Guard events</h2><p>No guard acted (no run has entries in guard_events.jsonl).</p>'
        )
    head = (
        "<tr><th>run</th><th>step</th><th>stage</th><th>guard</th><th>action</th><th>reason</th><th>signal</th>"
        "<th>threshold</th><th>detail</th></tr>"
    )
    return f'<h2 id="guard-events">Guard events</h2><table>{head}{"".join(rows)}</table>'


def _detail(event: dict[str, Any]) -> str:
    """What the action did beyond its name: the gradient scale, the new coefficients, the first suspected step."""
    parts = [f"gradients x{event['scale']:g}"] if "scale" in event else []
    parts += [f"{k} = {_fmt(v)}" for k, v in (event.get("adjustments") or {}).items()]
    parts += [f"back to before step {event['since']}"] if "since" in event else []
    return "; ".join(parts)


def _fmt(x: Any) -> str:
    return "" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
