"""The built-in ``table_lookup`` task: rows with a hidden table, answers only the ``lookup`` tool reads, held-out
tables; and the round trip through the shipped ``tools-tiny`` tokenizer: every character of prompts, calls,
results and errors is a token, a tool result is the chat template's delta, and an episode that replays a task's
trace through ``MultiTurnRollout`` is token for token the sequence ``armor sft`` trained on."""

from __future__ import annotations

import asyncio
import json
import string

import pytest
import torch

import armor_plugins.tasks.table_lookup as task_module
from armor_core.config.schema import MultiTurnConfig, RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import AssistantTurn
from armor_core.loop.data import normalize_row
from armor_core.models.loading import encode_prompts, load_tokenizer
from armor_core.testing import registered
from armor_core.train.sft_traces import encode_traces
from armor_core.workers.rollout.multi_turn import MultiTurnRollout
from armor_core.workers.rollout.observations import TRUNCATED, ObservationRenderer
from armor_plugins.environments.builtin_tools import lookup
from armor_plugins.environments.parsers import parse_hermes
from armor_plugins.environments.schema import tool_schema
from armor_plugins.environments.tools import ToolsEnvironment
from armor_plugins.tasks.table_lookup import generate_table_lookup, tool_call_text, tool_trace

TOOLS = ["armor_plugins.environments.builtin_tools:lookup"]


def _asked(row) -> str:
    text = row["prompt"][0]["content"]
    assert text.startswith("value of ") and text.endswith("?") and len(row["prompt"]) == 1
    return text[len("value of ") : -1]


def test_registered_through_the_hook():
    with registered(task_module, load_entrypoints=False) as pm:
        assert pm.get("task", "table_lookup").fn is generate_table_lookup


def test_rows_hide_the_table_and_answer_from_it():
    rows = generate_table_lookup("train", 300, 3, keys=5)
    for row in rows:
        table = row["extra_info"]["tools_kwargs"]["lookup"]["table"]
        key = _asked(row)
        assert len(table) == 5 and all(len(k) == 2 and set(k) <= set("abcdefgh") for k in table)
        assert all(10 <= v <= 99 for v in table.values())
        assert row["ground_truth"] == str(table[key]) and row["data_source"] == "table_lookup"
        assert not any(c.isdigit() for c in row["prompt"][0]["content"])  # nothing of the table in the prompt
    # the asked key is not always first in the table, and values vary, so neither position nor prior gives it
    assert len({list(r["extra_info"]["tools_kwargs"]["lookup"]["table"]).index(_asked(r)) for r in rows}) == 5
    assert len({r["ground_truth"] for r in rows}) > 50
    assert {_asked(r) for r in generate_table_lookup("train", 50, 0, alphabet="xy")} <= {"xx", "xy", "yx", "yy"}


def test_test_tables_are_not_training_tables():
    def tables(split, seed):
        return {json.dumps(r["extra_info"], sort_keys=True) for r in generate_table_lookup(split, 300, seed)}

    train = tables("train", 0) | tables("train", 1)
    test = tables("test", 0) | tables("test", 1)
    assert len(test) == 600 and not train & test
    assert generate_table_lookup("val", 5, 1) == generate_table_lookup("test", 5, 1)
    assert generate_table_lookup("train", 5, 1) != generate_table_lookup("train", 5, 2)
    assert generate_table_lookup("train", 5, 1) == generate_table_lookup("train", 5, 1)


@pytest.mark.parametrize(
    "kwargs", [{"keys": 1}, {"keys": 27}, {"colour": "red"}, {"alphabet": "a"}, {"alphabet": "AB"}]
)
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises((ValueError, TypeError), match="table_lookup task"):
        generate_table_lookup("train", 2, 0, **kwargs)


def test_the_trace_call_reads_the_answer_through_the_tools_environment():
    raw = generate_table_lookup("test", 4, 0)
    for r in raw:
        row = normalize_row(r, "row")  # as a run loads it: the table under extra.tools_kwargs
        trace = tool_trace(r)
        call = trace["messages"][1]["content"]
        assert parse_hermes(call)[0].arguments == {"key": _asked(r)}
        env = ToolsEnvironment(row, tools=TOOLS)
        step = asyncio.run(env.step(AssistantTurn(call, (), 0, True)))
        assert step.observation == [{"role": "tool", "content": r["ground_truth"]}]
        assert trace["messages"][2]["content"] == r["ground_truth"] == trace["messages"][3]["content"]
        assert asyncio.run(env.step(AssistantTurn(r["ground_truth"], (), 1, True))).done


# -- the shipped tokenizer --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tools-tiny")


def test_every_character_the_episodes_use_is_a_token(tokenizer):
    texts = [string.ascii_letters + string.digits + string.punctuation + " \n", TRUNCATED, tool_call_text("qx")]
    texts.append(asyncio.run(ToolsEnvironment({"extra": {}}, tools=TOOLS)._call(parse_hermes(texts[2])[0]))[0])
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    call = tokenizer(tool_call_text("qx"), add_special_tokens=False)["input_ids"]
    assert len(call) == len(tool_call_text("qx")) - len("<tool_call></tool_call>") + 2  # the tags are one token each


def test_a_tool_result_is_the_template_delta_after_the_sampled_end_of_turn(tokenizer):
    renderer = ObservationRenderer(tokenizer, max_tokens=32)
    ids, cut = renderer.render([{"role": "tool", "content": "57"}], tokenizer.eos_token)
    assert tokenizer.convert_ids_to_tokens(ids) == ["<|tool|>", "5", "7", "<|assistant|>"] and not cut
    # a turn cut by the budget (no EOS sampled) gets the EOS the template writes after an assistant turn
    ids, _ = renderer.render([{"role": "tool", "content": "57"}], None)
    assert ids[0] == tokenizer.eos_token_id and ids[1:] == renderer.render("57", "<eos>", role="tool")[0]
    # the whole conversation rendered at once is the prompt + turn + delta, never re-tokenised
    prompt = [{"role": "user", "content": "value of qx?"}]
    turn = [{"role": "assistant", "content": "x"}]
    whole = tokenizer.apply_chat_template(prompt + turn + [{"role": "tool", "content": "57"}], tokenize=False,
                                          add_generation_prompt=True)  # fmt: skip
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) + "x"
    assert tokenizer(whole, add_special_tokens=False)["input_ids"] == (
        tokenizer(head, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] + ids[1:]
    )


class Replay:
    """A rollout backend that writes, for every episode, its trace's next assistant turn."""

    def __init__(self, tokenizer, turns):
        self.turns, self.calls = turns, 0
        self.eos_token_ids, self.pad_token_id = [tokenizer.eos_token_id], tokenizer.pad_token_id

    def generate(self, batch, **_):
        rows = [t[self.calls] for t in self.turns]
        self.calls += 1
        width = max(len(r) for r in rows)
        responses = torch.tensor([r + [self.pad_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        tensors = {"responses": responses, "response_mask": mask, "rollout_log_probs": torch.zeros(mask.shape)}
        return DataProto.from_dict(tensors=tensors)


def test_an_episode_replaying_a_trace_is_the_sequence_sft_trains_on(tokenizer):
    raw = generate_table_lookup("test", 3, 5)
    rows = [normalize_row(r, "row") for r in raw]
    tools = [tool_schema(lookup)]
    traces = [tool_trace(r, tools) for r in raw]
    encoded = encode_traces(tokenizer, traces)
    eos = tokenizer.eos_token_id
    turns = [[tokenizer(m["content"], add_special_tokens=False)["input_ids"] + [eos]
              for m in t["messages"] if m["role"] == "assistant"] for t in traces]  # fmt: skip
    ids, mask, _, _ = encode_prompts(tokenizer, [r["prompt"] for r in rows], 64, chat_template_kwargs={"tools": tools})
    prompts = DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask},
        non_tensors={"extra": [r["extra"] for r in rows], "uid": list(range(3))},
    )
    config = RolloutConfig(max_new_tokens=48, multi_turn=MultiTurnConfig(enable=True, max_response_tokens=112))
    config.multi_turn.environment_kwargs = {"tools": TOOLS}
    out = MultiTurnRollout(Replay(tokenizer, turns), tokenizer, config, ToolsEnvironment).generate(prompts)
    assert out.meta_info["metrics"]["env/ended_done"] == 1.0 and out.meta_info["metrics"]["env/tool_errors"] == 0
    for i, (trace_ids, trace_mask) in enumerate(encoded):
        n_prompt = int(mask[i].sum())
        assert ids[i][mask[i].bool()].tolist() == trace_ids[:n_prompt]  # the prompt, tools rendered alike
        resp = out["responses"][i].tolist()[: len(trace_ids) - n_prompt]
        assert resp == trace_ids[n_prompt:]
        assert out["response_mask"][i].tolist()[: len(resp)] == trace_mask[n_prompt:]
        assert out.non_tensors["reward_text"][i] == raw[i]["ground_truth"]
