"""``armor sft``: the response-only loss, that a short run learns, and the command's output."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

import armor_plugins.tasks.arithmetic as arithmetic_module
from armor_core.cli.sft import add_parser
from armor_core.errors import UserFacingError
from armor_core.models.loading import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
from armor_core.testing import registered
from armor_core.train.sft import evaluate_greedy, load_pairs, response_only_loss, run_sft
from armor_core.workers.actor.schedule import lr_factor as _lr_factor
from armor_plugins.tasks.arithmetic import generate_arithmetic

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


def _pairs(split: str, size: int, **params) -> list[dict]:
    return [
        {"prompt": r["prompt"], "response": r["ground_truth"], "ground_truth": r["ground_truth"]}
        for r in generate_arithmetic(split, size, 0, **params)
    ]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="armor")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["sft", *argv])


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# -- the loss -------------------------------------------------------------------------------------


def test_loss_counts_response_tokens_only():
    input_ids = torch.tensor([[0, 1, 1, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1]])  # tokens 2 and 3 are the response
    logits = torch.zeros(1, 4, 2, requires_grad=True)
    with torch.no_grad():
        logits[0, 0] = torch.tensor([100.0, 0.0])  # predicts prompt token 1 very badly: must not count
        logits[0, 1] = torch.tensor([0.0, 0.0])  # predicts response token 1 with p = 1/2
        logits[0, 2] = torch.tensor([math.log(3.0), 0.0])  # predicts response token 0 with p = 3/4
        logits[0, 3] = torch.tensor([-50.0, 50.0])  # after the last token: nothing to predict
    loss = response_only_loss(logits, input_ids, loss_mask)
    assert loss.item() == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, abs=1e-6)
    loss.backward()
    assert torch.count_nonzero(logits.grad[0, 0]) == 0 and torch.count_nonzero(logits.grad[0, 3]) == 0


def test_loss_averages_over_all_response_tokens_of_the_batch():
    # row 0 has one target with loss log 2, row 1 three targets with loss log 2 each -> mean log 2,
    # and an all-masked row adds nothing
    input_ids = torch.zeros(3, 4, dtype=torch.long)
    loss_mask = torch.tensor([[0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0]])
    loss = response_only_loss(torch.zeros(3, 4, 2), input_ids, loss_mask)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert (
        response_only_loss(torch.zeros(1, 3, 2), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3)).item() == 0.0
    )


def test_learning_rate_schedules():
    # warm-up of 2 steps (1/2, 1), then over the remaining 4 steps: cosine 1, (1+cos(pi/4))/2, 1/2, ..., 0
    cos = _lr_factor(2, "cosine", 6)
    assert [cos(s) for s in (0, 1, 2, 4, 6, 9)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0, 0.0])
    assert cos(3) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    lin = _lr_factor(2, "linear", 6)
    assert [lin(s) for s in (0, 1, 2, 3, 4, 5, 6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])
    const = _lr_factor(4, "constant", 6)
    assert [const(s) for s in (0, 3, 5)] == pytest.approx([0.25, 1.0, 1.0])
    with pytest.raises(ValueError, match="lr_schedule='step'"):
        _lr_factor(0, "step", 6)


# -- training -------------------------------------------------------------------------------------


def test_short_sft_learns_one_digit_addition_on_held_out_problems():
    torch.manual_seed(0)
    train, val = _pairs("train", 2000, digits=1), _pairs("test", 20, digits=1)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    tok = build_char_tokenizer("0123456789+=")
    model = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    before = evaluate_greedy(model, tok, val)
    logs: list[str] = []
    result = run_sft(
        model, tok, train, val, steps=200, batch_size=32, lr=3e-3, warmup_steps=10, eval_every=100, log=logs.append
    )
    assert before <= 0.1
    assert result["val_accuracy"] >= 0.5  # ~0.8 on this machine
    assert result["steps"] == 200 and [h[0] for h in result["history"]] == [100, 200]
    assert result["history"][1][1] < result["history"][0][1]  # the loss went down
    assert any("held-out greedy accuracy" in line for line in logs)


def test_stop_at_accuracy_ends_at_the_first_evaluation_that_reaches_it():
    tok = build_char_tokenizer("0123456789+=")
    model = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2, seed=0)
    result = run_sft(
        model,
        tok,
        _pairs("train", 64, digits=1),
        _pairs("test", 4, digits=1),
        steps=10,
        batch_size=8,
        eval_every=2,
        stop_at_accuracy=0.0,
        log=lambda _: None,
    )
    assert result["steps"] == 2 and len(result["history"]) == 1


def test_evaluate_greedy_compares_the_stripped_response():
    class Echo(torch.nn.Module):
        """Answers every prompt with the characters ' 3', then EOS."""

        def __init__(self, tok):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.script = tok(" 3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            self.vocab = len(tok)

        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            tail = torch.tensor(self.script[:max_new_tokens]).expand(input_ids.shape[0], -1)
            return torch.cat([input_ids, tail], dim=1)

    tok = build_char_tokenizer("0123456789+= ")
    rows = [
        {"prompt": "1+2=", "ground_truth": "3"},
        {"prompt": "2+2=", "ground_truth": "4"},
        {"prompt": "0+3=", "ground_truth": " 3 "},
    ]
    assert evaluate_greedy(Echo(tok), tok, rows) == pytest.approx(2 / 3)


# -- the command ----------------------------------------------------------------------------------


def test_sft_command_writes_a_loadable_model_and_is_deterministic(tmp_path, capsys):
    rows = [
        {"prompt": r["prompt"], "ground_truth": r["ground_truth"]}
        for r in generate_arithmetic("train", 40, 0, digits=1)
    ]
    _write_jsonl(tmp_path / "data.jsonl", rows)
    outs = []
    for name in ("a", "b"):
        args = _parse(
            [
                "--init",
                "tiny-qwen2",
                "--data",
                str(tmp_path / "data.jsonl"),
                "--out",
                str(tmp_path / name),
                "--steps",
                "3",
                "--batch-size",
                "8",
                "--eval-every",
                "3",
                "--seed",
                "5",
            ]
        )
        assert args.func(args) == 0
        outs.append(tmp_path / name)
    printed = capsys.readouterr().out
    assert "36 train / 4 held-out rows" in printed and "held-out greedy accuracy" in printed
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "armor_sft.json"):
        assert (outs[0] / f).is_file(), f
    a, b = load_model(outs[0]), load_model(outs[1])
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert 1.0e6 < sum(p.numel() for p in a.parameters()) < 1.1e6
    tok = load_tokenizer(outs[0])
    assert tok.decode(tok("85")["input_ids"], skip_special_tokens=True) == "85"
    summary = json.loads((outs[0] / "armor_sft.json").read_text())
    assert summary["steps"] == 3 and summary["args"]["seed"] == 5


def test_sft_command_on_a_task_fine_tunes_an_existing_model(tmp_path):
    with registered(arithmetic_module, load_entrypoints=False):
        args = _parse(
            [
                "--model",
                "builtin:arithmetic-tiny",
                "--task-kwarg",
                "digits=1",
                "--train-size",
                "32",
                "--val-size",
                "4",
                "--steps",
                "1",
                "--batch-size",
                "4",
                "--lr",
                "1e-5",
                "--out",
                str(tmp_path / "ft"),
            ]
        )
        assert args.func(args) == 0
    summary = json.loads((tmp_path / "ft" / "armor_sft.json").read_text())
    assert summary["args"]["task_kwarg"] == ["digits=1"] and summary["steps"] == 1
    assert load_model(tmp_path / "ft").config.model_type == "qwen2"


def test_the_command_needs_a_model_source_and_an_output():
    with pytest.raises(SystemExit):
        _parse(["--out", "x"])
    with pytest.raises(SystemExit):
        _parse(["--init", "tiny-qwen2"])
    with pytest.raises(SystemExit):
        _parse(["--init", "tiny-qwen2", "--model", "m", "--out", "x"])


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--task-kwarg", "digits"], "not KEY=VALUE"),
        (["--task", "arithmetics"], "Did you mean 'arithmetic'"),
        (["--steps", "0"], "--steps=0 must be >= 1"),
        (["--data", "/nonexistent/data.jsonl"], "does not exist"),
        (["--data", "TINY"], "no held-out rows"),
    ],
)
def test_bad_input_is_one_clear_error(argv, match, tmp_path):
    if "TINY" in argv:  # 5 rows: a tenth of them is no row at all
        _write_jsonl(tmp_path / "tiny.jsonl", [{"prompt": f"{i}+0=", "response": str(i)} for i in range(5)])
        argv = [str(tmp_path / "tiny.jsonl") if a == "TINY" else a for a in argv]
    with registered(arithmetic_module, load_entrypoints=False):
        args = _parse(["--init", "tiny-qwen2", "--out", str(tmp_path / "o"), *argv])
        with pytest.raises(UserFacingError, match=match):
            args.func(args)


def test_load_pairs_reads_response_or_ground_truth_and_names_bad_lines(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "1+1=", "response": " 2", "ground_truth": 2}\n\n{"prompt": "2+2=", "ground_truth": 4}\n')
    assert load_pairs(f) == [
        {"prompt": "1+1=", "response": " 2", "ground_truth": "2"},
        {"prompt": "2+2=", "response": "4", "ground_truth": "4"},
    ]
    f.write_text('{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(ValueError, match=r"d.jsonl, line 2: needs a 'response'"):
        load_pairs(f)
    f.write_text('{"prompt": "1+1=", "response": "2"}\nnot json\n')
    with pytest.raises(ValueError, match=r"line 2: not valid JSON"):
        load_pairs(f)
    f.write_text('{"question": "1+1="}\n')
    with pytest.raises(ValueError, match=r"line 1: expected an object with a text field 'prompt'"):
        load_pairs(f)
