"""Tools that ship with ARMOR, for the ``tools`` environment (``module:function`` names):

- ``armor_plugins.environments.builtin_tools:calculator``: integer and decimal arithmetic.
- ``armor_plugins.environments.builtin_tools:lookup``: a value of a table the row hides from the
  policy (``extra.tools_kwargs.lookup.table``).

The calculator evaluates the expression's syntax tree itself: numbers, + - * / // % **, unary minus
and parentheses, nothing else (no names, calls or attributes), with bounds on the input's length,
on exponents and on the size of results, so no expression a policy writes can run code or exhaust
memory.
"""

from __future__ import annotations

import ast
import operator

__all__ = ["calculator", "lookup"]

_MAX_CHARS = 200
_MAX_EXPONENT = 64
_MAX_DIGITS = 64
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {_MAX_EXPONENT}")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and len(str(abs(result))) > _MAX_DIGITS:
            raise ValueError(f"the result has more than {_MAX_DIGITS} digits")
        return result
    raise ValueError(f"{ast.dump(node)[:40]}... is not arithmetic: use numbers, + - * / // % ** and parentheses")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(17 + 25) * 3".
    """
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"the expression is longer than {_MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    try:
        result = _value(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


def lookup(key: str, *, table: dict | None = None) -> str:
    """Read the value stored under a key.

    Args:
        key: the key to read, e.g. "alpha".
    """
    if not table:
        raise ValueError("this row has no table (extra.tools_kwargs.lookup.table)")
    if key not in table:
        raise KeyError(f"no key {key!r}; keys: {', '.join(sorted(map(str, table)))}")
    return str(table[key])
