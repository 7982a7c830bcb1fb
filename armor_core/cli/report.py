"""``armor report RUN_DIR [RUN_DIR ...] [--out DIR] [--label NAME ...]``: plots and an HTML page of runs."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="plot one or more runs (PNGs and a self-contained HTML page)",
        description="Read each RUN_DIR's metrics.jsonl, guard_events.jsonl and config.json and write one PNG per "
        "group of metrics (held-out accuracy, training score per domain and sub-score, KL, entropy, "
        "clip fractions, gradient norm, response length, learning rate, seconds per step by stage, "
        "rollout/trainer log-prob difference), every run on the same axes and every guard action "
        "marked where it happened, plus index.html (the PNGs embedded, a table of guard events) and "
        "report.json (what each plot holds). Works on a run that is still going or that crashed.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (trainer.run_dir of `armor run`)")
    p.add_argument("--out", help="where to write (default: the first RUN_DIR's report/)")
    p.add_argument(
        "--label",
        dest="labels",
        action="append",
        metavar="NAME",
        help="a run's name in the legends, once per RUN_DIR in order (default: the directory names)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from armor_core.report import PAGE, write_report

    report = write_report(args.run_dirs, args.out, args.labels)
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report"
    for run in report["runs"]:
        for note in run["notes"]:
            print(f"{run['label']}: {note}")
    print(
        f"wrote {len(report['plots'])} plots and {out / PAGE}"
        + (f" (not drawn, no metrics: {', '.join(report['not_drawn'])})" if report["not_drawn"] else "")
    )
    return 0
