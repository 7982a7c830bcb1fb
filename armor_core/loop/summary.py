"""The table ``armor run`` prints at the end of a run, from its ``summary.json`` contents."""

from __future__ import annotations

from typing import Any

__all__ = ["print_summary"]


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False, soft_wrap=True)
    table = Table(
        title=f"ARMOR run: {summary['steps']} steps in {summary['wall_s']:.1f} s; held-out accuracy per data_source"
    )
    for name in ("", "before", "after", "change"):
        table.add_column(name, justify="right" if name else "left")
    b, a = summary.get("val_before") or {}, summary.get("val_after") or {}
    # per data_source first, the overall figure (val/acc_<mode>) last
    for k in sorted(
        (k for k in set(b) | set(a) if k.startswith("val/") and "/acc_" in k), key=lambda k: (k.count("/") < 2, k)
    ):
        change = f"{(a[k] - b[k]) * 100:+.1f} pts" if k in a and k in b else "-"
        table.add_row(k, f"{b[k]:.3f}" if k in b else "-", f"{a[k]:.3f}" if k in a else "-", change)
    c.print(table)
    t = summary["timing_s_mean"]
    if t:
        c.print(
            "seconds per step by stage: "
            + ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
        )
    c.print(
        f"start-up: ray {summary['startup_s']['ray_init']:.1f} s, workers {summary['startup_s']['workers']:.1f} s; "
        f"checkpoint: {summary['checkpoint']}"
    )
