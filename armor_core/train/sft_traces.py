"""``armor sft`` on multi-turn traces: chat transcripts with tool results, the loss on the model's own turns.

A trace row of ``--data`` is ``{"messages": [...], "tools": [schema, ...], "ground_truth": ...}``:
a prompt (user or system messages), then assistant turns, each but the last followed by the
environment's ``tool`` (or ``user``) messages. It is tokenised the way a multi-turn rollout builds
the episode (``armor_core.workers.rollout.multi_turn``), so the warm start learns exactly the ids RL will
sample: the prompt through the chat template with ``tools`` and a generation prompt; each
assistant turn as its content's ids and EOS (targets, loss 1); each observation as the delta the
chat template appends after a turn that ended with EOS (``ObservationRenderer``; loss 0, the
policy reads it and is never trained to write it).

Held-out accuracy of traces is teacher-forced: a trace counts when the model's greedy choice is the
trace's token at every target position. For a deterministic environment that is exactly "a greedy
episode reproduces the trace", without running the environment.

``build_chat_char_tokenizer`` makes a character-level tokenizer with a chat template that only
appends (so observations are deltas), role markers as special tokens and the Hermes
``<tool_call>`` tags as single, ordinary tokens (they survive ``skip_special_tokens`` decoding,
which the tool-call parser reads).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

from armor_core.train.jsonl import json_lines
from armor_core.train.steps import evaluating, pad_encoded

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "CHAR_CHAT_TEMPLATE",
    "build_chat_char_tokenizer",
    "encode_traces",
    "is_trace_file",
    "load_traces",
    "trace_accuracy",
]

ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|tool|>"]
CALL_TOKENS = ["<tool_call>", "</tool_call>"]
#: append-only: a message's rendering never depends on what follows it; tools are named, not described
#: (a 1M-parameter model cannot read a JSON schema, and a prompt of hundreds of characters only slows it)
CHAR_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|>{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'tool' %}<|tool|>{{ m.content }}{% else %}<|user|>{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_ROLES = ("system", "user", "assistant", "tool")


def build_chat_char_tokenizer(chars: Iterable[str] = ()) -> Any:
    """A char-level tokenizer (``build_char_tokenizer``) over printable ASCII and ``chars``, with
    ``CHAR_CHAT_TEMPLATE``, its role tokens (special) and the ``<tool_call>`` tags (ordinary)."""
    from armor_core.models.loading import build_char_tokenizer

    # every printable character: tool errors, JSON and the truncation marker are tokens, never <unk>
    tok = build_char_tokenizer([string.printable.replace("\x0b", "").replace("\x0c", ""), *chars])
    tok.add_special_tokens({"additional_special_tokens": ROLE_TOKENS})
    tok.add_tokens(CALL_TOKENS)
    tok.chat_template = CHAR_CHAT_TEMPLATE
    return tok


def is_trace_file(path: str | Path) -> bool:
    """Whether the JSONL's first row is a trace (has ``messages``)."""
    if not Path(path).is_file():
        return False  # load_pairs names a missing file or a directory as the user error it is
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False  # load_pairs reports the line
                return isinstance(first, dict) and "messages" in first
    return False


def _check_trace(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list) or not raw["messages"]:
        raise ValueError(f"{where}: expected an object with a non-empty list 'messages'")
    msgs = raw["messages"]
    for j, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}, message {j}: expected {{role: one of {', '.join(_ROLES)}, content: text}}")
    if msgs[-1]["role"] != "assistant":
        raise ValueError(f"{where}: the last message must be the assistant's final answer")
    if msgs[0]["role"] == "assistant":
        raise ValueError(f"{where}: the first message must be the prompt (user or system), not the assistant")
    tools = raw.get("tools") or []
    if not isinstance(tools, list):
        raise ValueError(f"{where}: 'tools' must be a list of function schemas")
    gt = raw.get("ground_truth", msgs[-1]["content"])
    return {"messages": msgs, "tools": tools, "ground_truth": str(gt)}


def load_traces(path: str | Path) -> list[dict[str, Any]]:
    """Trace rows from a JSONL file (see the module docstring); every bad row names its line."""
    rows = [_check_trace(raw, f"{path}, line {lineno}") for lineno, raw in json_lines(path)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def encode_traces(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """Each trace as (ids, loss mask), built as a multi-turn rollout builds its episode."""
    from armor_core.workers.rollout.observations import ObservationRenderer

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("trace rows need a tokenizer with a chat template (--init tiny-qwen2 builds one)")
    eos = tokenizer.eos_token_id
    if not isinstance(eos, int):
        raise ValueError(f"trace rows need a tokenizer with an EOS token, which ends each assistant turn (got {eos!r})")
    ended_with = cast(str, tokenizer.decode([eos]))  # one sequence of ids decodes to one string
    renderer = ObservationRenderer(tokenizer, max_tokens=10**9)
    out = []
    for row in rows:
        msgs = row["messages"]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        text = cast(  # tokenize=False: the rendered string
            str,
            tokenizer.apply_chat_template(
                msgs[:first], tokenize=False, add_generation_prompt=True, tools=row["tools"] or None
            ),
        )
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        mask = [0] * len(ids)
        pending: list[dict[str, str]] = []
        for m in msgs[first:]:
            if m["role"] != "assistant":
                pending.append(m)
                continue
            if pending:
                obs, _ = renderer.render(pending, ended_with)
                ids, mask, pending = ids + obs, mask + [0] * len(obs), []
            turn = list(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + [eos]
            ids, mask = ids + turn, mask + [1] * len(turn)
        out.append((ids, mask))
    return out


def trace_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], batch_size: int = 256
) -> float:
    """Share of traces whose every target token is the model's greedy choice (teacher-forced)."""
    from armor_core.models.loading import padding_id

    encoded = encode_traces(tokenizer, rows)
    pad = padding_id(tokenizer)
    correct = 0
    with evaluating(model):
        for start in range(0, len(encoded), batch_size):
            ids, att, mask = pad_encoded(encoded[start : start + batch_size], pad)
            guess = model(input_ids=ids, attention_mask=att).logits[:, :-1].argmax(-1)
            wrong = (guess != ids[:, 1:]) & mask[:, 1:].bool()
            correct += int((~wrong.any(-1)).sum())
    return correct / max(len(rows), 1)
