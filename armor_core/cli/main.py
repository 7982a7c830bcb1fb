"""The ``armor`` command line.

``armor run [CONFIG] [key=value ...]``   train (the built-in recipe when no CONFIG is given)
``armor plugins``                         every registered implementation, by kind, with its provider
``armor eval MODEL --data FILE``          accuracy per data_source
``armor sft ...``                         small supervised fine-tuning (how the built-in warm start was made)
``armor reward DOMAIN ...``               score rows with a reward domain, to check it before a long run
``armor report RUN_DIR [RUN_DIR ...]``    plots and an HTML page of one or more runs, overlaid
``armor new {guard,reward,estimator,environment} NAME`` a plugin package: example, contract, test, README

Each subcommand module exposes ``add_parser(subparsers)``; heavy imports (torch, ray) happen inside
the command, so ``armor --help`` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from armor_core.errors import UserFacingError, code_exit_error, one_line

# subcommand modules that provide add_parser(subparsers); order is the order of `armor --help`
_COMMAND_MODULES = [
    "armor_core.cli.run",
    "armor_core.cli.plugins",
    "armor_core.cli.eval",
    "armor_core.cli.export",
    "armor_core.cli.report",
    "armor_core.cli.new",
    "armor_core.cli.sft",
    "armor_core.cli.rm",
    "armor_core.cli.reward",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="armor",
        description="ARMOR: stable reinforcement-learning post-training of language models on verifiable rewards.",
        epilog="Run `armor <command> --help` for a command's options. "
        "`armor run` with no arguments trains the built-in recipe on CPU.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for mod_name in _COMMAND_MODULES:
        importlib.import_module(mod_name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse will not take positionals after options (`armor run cfg.yaml --resume actor.lr=1e-5`):
    # key=value leftovers are config overrides wherever they stand
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.version:
        from armor_core import __version__

        print(f"armor {__version__}")
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except user_errors() as e:
        print(one_line(e), file=sys.stderr)
        return 2
    except Exception:
        raise
    except BaseException as e:  # SystemExit from code a command ran (a plugin, a reward file): never a silent success
        print(one_line(code_exit_error(e, f"armor {args.command}")), file=sys.stderr)
        return 2


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that the CLI prints as one clear line instead of a traceback (here only: a
    command lets them propagate)."""
    from armor_core.config.schema import ConfigError
    from armor_core.engine.isolation import IsolationError
    from armor_core.loop.data import DataError
    from armor_core.models.loading import ModelPathError
    from armor_core.plugins import PluginError

    # IsolationError: the workers asked for more cores or GPUs than the machine gives (engine.*_per_worker)
    return (UserFacingError, ConfigError, PluginError, DataError, ModelPathError, IsolationError)


if __name__ == "__main__":
    sys.exit(main())
