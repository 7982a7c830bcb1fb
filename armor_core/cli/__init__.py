"""The ``armor`` command line: ``main`` parses and dispatches; one module per subcommand (``run``, ``plugins``,
``eval``, ``export``, ``report``, ``new``, ``sft``, ``reward``), each exposing ``add_parser(subparsers)``.
``python -m armor_core.cli`` is the ``armor`` script.
"""
