"""Subcommands of the ``armor`` CLI, one module each, each exposing ``add_parser(subparsers)``."""
