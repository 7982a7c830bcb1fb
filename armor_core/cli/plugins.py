"""``armor plugins``: every registered implementation by kind, with the plugin and distribution behind it."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plugins",
        help="list every registered plugin implementation by kind",
        description="List every registered implementation (advantage estimators, policy losses, KL estimators, "
        "loss aggregations, reward domains, stability guards, rollout backends, tasks, metric trackers) with the "
        "plugin and the distribution (name and version) that provides it. ARMOR_DISABLE_PLUGINS=a,b hides "
        "plugins by name.",
    )
    p.add_argument("--kind", help="only this kind (e.g. advantage_estimator)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from armor_core.interfaces import KINDS
    from armor_core.plugins import get_plugin_manager

    if args.kind is not None and args.kind not in KINDS:
        import difflib

        from armor_core.errors import UserFacingError

        close = difflib.get_close_matches(args.kind, KINDS, n=1)
        raise UserFacingError(
            f"armor plugins --kind {args.kind}: no such kind.{f' Did you mean {close[0]!r}?' if close else ''} "
            f"Kinds: {', '.join(KINDS)}"
        )
    pm = get_plugin_manager()
    kinds = [args.kind] if args.kind else list(KINDS)
    entries = [e for k in kinds for e in pm.entries(k)]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "kind": e.kind,
                        "name": e.name,
                        "plugin": e.plugin,
                        "distribution": e.distribution,
                        "version": e.version,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ARMOR plugins", show_lines=False)
    for col in ("kind", "name", "plugin", "distribution", "version"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(e.kind, e.name, e.plugin, e.distribution, e.version)
    Console(width=120).print(table)
    if pm.disabled:
        print(f"disabled by ARMOR_DISABLE_PLUGINS: {', '.join(sorted(pm.disabled))}")
    return 0
