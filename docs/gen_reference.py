"""A mkdocs hook (``hooks:`` in mkdocs.yml) that writes the command-line and configuration reference
pages at build time, from the code itself, so they cannot go stale:

- ``reference/cli.md``: ``armor --help`` and every subcommand's ``--help`` (nested ones too, such as
  ``armor rm train``), from the parser ``armor_core.cli.main.build_parser`` builds;
- ``reference/config.md``: every config key with its default and help text, from
  ``armor_core.config.schema.help_for``, the rows ``armor run --help-config`` prints.

Neither page is a file in the repository. ``python docs/gen_reference.py cli|config`` prints a page.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_WIDTH = "100"  # argparse wraps help to $COLUMNS; fixed, so the page does not depend on the terminal


@contextmanager
def _repo_on_path() -> Iterator[None]:
    """Import this checkout's armor_core, whatever else is installed."""
    sys.path.insert(0, str(ROOT))
    try:
        yield
    finally:
        sys.path.remove(str(ROOT))


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield sub
                yield from _subcommands(sub)


def cli_reference() -> str:
    with _repo_on_path():
        from armor_core.cli.main import build_parser

        before = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = HELP_WIDTH
        try:
            parser = build_parser()
            parsers = [parser, *_subcommands(parser)]
            helps = [(p.prog, p.format_help()) for p in parsers]
        finally:
            if before is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = before
    lines = [
        "# Command line",
        "",
        "Generated from the `armor` command's own parser when the site is built: each section is what",
        "`armor COMMAND --help` prints.",
        "",
    ]
    for prog, text in helps:
        lines += [f"## `{prog}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _help_html(text: str) -> str:
    """The help text as HTML: escaped, with its `code` spans kept."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _escape(text))


def config_reference() -> str:
    with _repo_on_path():
        from armor_core.config.schema import help_for

        rows = help_for()
    sections: dict[str, list[tuple[str, str, object]]] = {}
    for key, help_text, default in rows:
        sections.setdefault(key.split(".")[0], []).append((key, help_text, default))
    lines = [
        "# Configuration",
        "",
        "Every config key with its default and help text, generated from the config schema",
        "(`armor_core/config/schema.py`) when the site is built; `armor run --help-config` prints the same.",
        "Set a key in a YAML file or as `key=value` on the command line (`armor run my_run.yaml actor.lr=1e-5`).",
        "",
    ]
    for section, entries in sections.items():
        lines += [f"## `{section}`", "", "<table>", "<tr><th>key</th><th>default</th><th>help</th></tr>"]
        for key, help_text, default in entries:
            cells = (f"<code>{_escape(key)}</code>", f"<code>{_escape(repr(default))}</code>", _help_html(help_text))
            lines.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
        lines += ["</table>", ""]
    return "\n".join(lines)


PAGES = {"reference/cli.md": cli_reference, "reference/config.md": config_reference}


def on_files(files, config):
    """mkdocs event: add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("cli", "config"):
        sys.exit("usage: python docs/gen_reference.py cli|config")
    print(PAGES[f"reference/{which}.md"]())
