"""``armor sft`` on multi-turn traces: the loss mask covers the model's own turns only, teacher-forced accuracy
counts only those, bad rows name their line, and the command writes a chat-template tokenizer."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from armor_core.cli.sft import add_parser
from armor_core.models.loading import load_tokenizer
from armor_core.train.sft_traces import build_chat_char_tokenizer, encode_traces, load_traces, trace_accuracy

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = '<tool_call>{"name":"lookup","arguments":{"key":"qx"}}</tool_call>'


def _trace(value="57", key="qx"):
    return {
        "messages": [
            {"role": "user", "content": f"value of {key}?"},
            {"role": "assistant", "content": CALL.replace("qx", key)},
            {"role": "tool", "content": value},
            {"role": "assistant", "content": value},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup"}}],
    }


@pytest.fixture(scope="module")
def tokenizer():
    return build_chat_char_tokenizer()


def test_the_loss_is_on_the_assistant_turns_and_their_eos_only(tokenizer):
    [(ids, mask)] = encode_traces(tokenizer, [_trace()])
    targets = [t for t, m in zip(ids, mask) if m]
    eos = tokenizer.eos_token_id
    assert targets == tokenizer(CALL, add_special_tokens=False)["input_ids"] + [eos] + (
        tokenizer("57", add_special_tokens=False)["input_ids"] + [eos]
    )
    context = tokenizer.convert_ids_to_tokens([t for t, m in zip(ids, mask) if not m])
    # the prompt with its tools line, then the tool's result between the template's markers: never targets
    assert "".join(context) == "<bos>tools: lookup\n<|user|>value of qx?<|assistant|><|tool|>57<|assistant|>"


class Oracle(torch.nn.Module):
    """Logits whose argmax is the sequence's own next token, except at the positions in ``wrong``."""

    def __init__(self, vocab, wrong=()):
        super().__init__()
        self.vocab, self.wrong = vocab, set(wrong)

    def forward(self, input_ids, attention_mask):
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
        for t in self.wrong:
            nxt[:, t] = (nxt[:, t] + 1) % self.vocab
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


def test_teacher_forced_accuracy_counts_target_tokens_only(tokenizer):
    rows = [_trace()]
    [(ids, mask)] = encode_traces(tokenizer, rows)
    vocab = len(tokenizer)
    assert trace_accuracy(Oracle(vocab), tokenizer, rows) == 1.0
    observation = next(i for i in range(1, len(ids)) if not mask[i] and mask[i - 1])  # after the call's EOS
    assert trace_accuracy(Oracle(vocab, wrong=[observation - 1]), tokenizer, rows) == 1.0  # predicting the tool
    answer = len(ids) - 2  # the last digit of the answer
    assert trace_accuracy(Oracle(vocab, wrong=[answer - 1]), tokenizer, rows) == 0.0


@pytest.mark.parametrize(
    "row, match",
    [
        ({"messages": []}, "non-empty list 'messages'"),
        ({"messages": [{"role": "user", "content": "a"}]}, "last message must be the assistant"),
        ({"messages": [{"role": "robot", "content": "a"}, {"role": "assistant", "content": "b"}]}, "message 0"),
        ({"messages": [{"role": "assistant", "content": "b"}]}, "first message must be the prompt"),
    ],
)
def test_bad_trace_rows_name_their_line(tmp_path, row, match):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_trace()) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=match) as e:
        load_traces(path)
    assert "line 2" in str(e.value)


def test_the_command_trains_on_traces_and_saves_a_chat_template_tokenizer(tmp_path, capsys):
    data = tmp_path / "traces.jsonl"
    data.write_text("".join(json.dumps(_trace(str(10 + i), k)) + "\n" for i, k in enumerate(["ab", "cd", "ef"] * 8)))
    parser = argparse.ArgumentParser(prog="armor")
    add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "model"
    args = parser.parse_args(["sft", "--init", "tiny-qwen2", "--out", str(out), "--data", str(data), "--steps", "3",
                              "--batch-size", "4", "--eval-every", "3", "--threads", "1"])  # fmt: skip
    assert args.func(args) == 0
    summary = json.loads((out / "armor_sft.json").read_text())
    assert summary["steps"] == 3 and summary["history"][-1][1] > 0  # a finite loss was measured
    tok = load_tokenizer(out)
    assert tok.chat_template and tok.convert_tokens_to_ids("<tool_call>") != tok.unk_token_id
    assert encode_traces(tok, [_trace()]) == encode_traces(build_chat_char_tokenizer(), [_trace()])
    assert "2 held-out rows" in capsys.readouterr().out  # a tenth of the 24 traces held out
