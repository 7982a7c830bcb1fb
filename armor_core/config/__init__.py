"""The run configuration: ``schema`` (typed dataclasses with help text, loading and checks), ``fields`` (field-level
range and type checks), ``plugin_checks`` (every plugin name resolved before Ray starts), ``recipes`` (shipped configs),
``packs`` (which reward pack provides which domain, for the error that says what to install).
"""
