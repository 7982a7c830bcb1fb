"""``armor report``: plots of one or more runs and a self-contained HTML page, from what their run
directories hold.

``write_report(run_dirs, out)`` reads each run's ``metrics.jsonl`` (as much as parses: a run still
going or one that crashed is fine), ``guard_events.jsonl`` and ``config.json`` (``runs``), draws one
PNG per group of metrics with every run overlaid and every guard action marked (``plots``), and
writes ``index.html`` with the PNGs embedded and a table of guard events (``page``), plus
``report.json``: what each plot holds, read back from the figure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from armor_core.report.runs import ReportError, Run, load_runs

__all__ = ["PAGE", "SIDECAR", "ReportError", "Run", "load_runs", "write_report"]

SIDECAR = "report.json"
PAGE = "index.html"


def write_report(
    run_dirs: Sequence[str | Path], out: str | Path | None = None, labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """Write the PNGs, ``index.html`` and ``report.json`` into ``out`` (default: the first run's
    ``report/``); returns the contents of ``report.json``."""
    from armor_core.report.page import render
    from armor_core.report.plots import draw, plan

    runs = load_runs(run_dirs, labels)
    out_dir = Path(out) if out is not None else Path(run_dirs[0]) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    planned, missing = plan(runs)
    plots = {p.name: draw(p, runs, out_dir / f"{p.name}.png") for p in planned}
    _remove_stale(out_dir, {p["file"] for p in plots.values()})
    report = {
        "runs": [
            {"label": r.label, "path": str(r.path), "last_step": r.last_step, "finished": r.finished, "notes": r.notes}
            for r in runs
        ],
        "plots": plots,
        "not_drawn": missing,
        "events": [{"run": r.label, **e} for r in runs for e in r.events],
        "page": PAGE,
    }
    _write_atomic(out_dir / SIDECAR, json.dumps(report, indent=1))
    _write_atomic(out_dir / PAGE, render(runs, plots, missing, out_dir))
    return report


def _remove_stale(out_dir: Path, current: set[str]) -> None:
    """PNGs an earlier report in ``out_dir`` wrote that this one did not (only those its report.json lists)."""
    try:
        earlier = json.loads((out_dir / SIDECAR).read_text())["plots"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    for plot in earlier.values():
        name = plot.get("file") if isinstance(plot, dict) else None
        if isinstance(name, str) and name not in current and Path(name).name == name:
            (out_dir / name).unlink(missing_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    """A browser reloading the page while a new report is written sees the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
