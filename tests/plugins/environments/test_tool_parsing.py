"""Tool schemas from plain functions, and the Hermes tool-call parser: what a model is told about a
tool and how its calls are read, including every malformed call a policy can write."""

from typing import Literal

import pytest

from armor_plugins.environments.parsers import ToolCall, parse_hermes
from armor_plugins.environments.schema import ToolSchemaError, tool_schema


def lookup(key: str, default: str | None = None, limit: int = 3) -> str:
    """Read one value of the table.

    Args:
        key: the row's key,
            e.g. "alpha".
        default: returned when the key is missing.

    Returns:
        The value.
    """
    return key


def test_schema_from_signature_and_docstring():
    fn = tool_schema(lookup)["function"]
    assert fn["name"] == "lookup" and fn["description"] == "Read one value of the table."
    props = fn["parameters"]["properties"]
    assert props["key"] == {"type": "string", "description": 'the row\'s key, e.g. "alpha".'}
    assert props["default"] == {"type": "string", "nullable": True, "description": "returned when the key is missing."}
    assert props["limit"] == {"type": "integer"}
    assert fn["parameters"]["required"] == ["key"]


def test_schema_types():
    def f(a: list[int], b: dict, c: Literal["x", "y"], d: float, e: bool) -> None:
        """F."""

    props = tool_schema(f)["function"]["parameters"]["properties"]
    assert props["a"] == {"type": "array", "items": {"type": "integer"}}
    assert props["b"] == {"type": "object"} and props["c"] == {"type": "string", "enum": ["x", "y"]}
    assert props["d"] == {"type": "number"} and props["e"] == {"type": "boolean"}


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda x: x, "has no type annotation"),
        (lambda *args: 0, r"\*args / \*\*kwargs"),
    ],
)
def test_schema_refuses_what_cannot_be_described(fn, message):
    with pytest.raises(ToolSchemaError, match=message):
        tool_schema(fn, name="t")


def test_schema_refuses_bad_types_and_names():
    def f(x: int | str) -> None: ...

    def g(x: object) -> None: ...

    with pytest.raises(ToolSchemaError, match="no single JSON type"):
        tool_schema(f)
    with pytest.raises(ToolSchemaError, match="has no JSON schema"):
        tool_schema(g)
    with pytest.raises(ToolSchemaError, match="tool name '1bad'"):
        tool_schema(lookup, name="1bad")


def test_parse_parallel_calls_in_order():
    text = (
        'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"b\\"}"}</tool_call>'
    )
    assert parse_hermes(text) == [ToolCall("lookup", {"key": "a"}), ToolCall("lookup", {"key": "b"})]
    assert parse_hermes("The answer is 42.") == []


@pytest.mark.parametrize(
    "block, error",
    [
        ("{not json}", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "t", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "t", "arguments": "{oops"}', '"arguments" string is not valid JSON'),
        ('{"name": "t", "arguments": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}", "nested too deeply"),
        ('{"name": "t", "arguments": {"x": ' + "9" * 5000 + "}}", "a number of more than 4300 digits"),
        ('{"name": "t", "arguments": "{\\"x\\": ' + "9" * 5000 + '}"}', "a number of more than 4300 digits"),
        ('{"name": "t", "arguments": "' + "[" * 100_000 + '"}', "nested too deeply"),
    ],
    ids=[
        "not json",
        "a list",
        "no name",
        "arguments a list",
        "arguments bad json",
        "deep",
        "huge int",
        "huge int, double-encoded",
        "deep, double-encoded",
    ],
)
def test_malformed_calls_become_errors_not_exceptions(block, error):
    (call,) = parse_hermes(f"<tool_call>{block}</tool_call>")
    assert call.error and error in call.error


def test_unclosed_call_is_an_error_and_parsing_is_linear():
    (call,) = parse_hermes('<tool_call>{"name": "t"}')
    assert "without its </tool_call>" in call.error
    many = "<tool_call>" * 200_000  # a policy's degenerate output: one error, found without backtracking
    assert len(parse_hermes(many)) == 1
