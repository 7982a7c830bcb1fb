"""Data loading: rows in our layout and verl's, and errors that name the file, line and field."""

from __future__ import annotations

import json

import pytest

from armor_core.loop.data import DataError, PromptLoader, load_rows


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_our_layout_and_verls_layout(tmp_path):
    f = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2", "level": 1},
            {
                "prompt": [{"role": "user", "content": "2+2?"}],
                "data_source": "math",
                "reward_model": {"ground_truth": "4"},
                "extra_info": {"split": "train"},
            },
        ],
    )
    ds = load_rows([str(f)])
    assert [r["ground_truth"] for r in ds.rows] == ["2", "4"]
    assert ds.rows[0]["extra"] == {"level": 1}
    assert ds.rows[1]["extra"] == {"split": "train"}
    assert isinstance(ds.rows[1]["prompt"], list)


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "3+4=", "data_source": "arithmetic", "ground_truth": "7"}]), path)
    assert load_rows([str(path)]).rows[0]["ground_truth"] == "7"


@pytest.mark.parametrize(
    "row, message",
    [
        ({"data_source": "arithmetic", "ground_truth": "2"}, "line 2: missing field 'prompt'"),
        (
            {"prompt": 5, "data_source": "arithmetic", "ground_truth": "2"},
            "line 2: field 'prompt' must be text or a list of chat messages, got int",
        ),
        (
            {"prompt": [{"text": "hi"}], "data_source": "arithmetic", "ground_truth": "2"},
            "line 2: field 'prompt' is a list but not of chat messages",
        ),
        ({"prompt": "1+1=", "ground_truth": "2"}, "line 2: missing or non-text field 'data_source'"),
        ({"prompt": "1+1=", "data_source": "arithmetic"}, "line 2: missing 'ground_truth'"),
        ("{not json", "line 2: not valid JSON"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    good = {"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2"}
    f = write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(DataError) as e:
        load_rows([str(f)], needs_ground_truth=lambda source: True)
    assert str(f) in str(e.value) and message in str(e.value) and "data.skip_invalid=true" in str(e.value)
    skipped = load_rows([str(f)], skip_invalid=True, needs_ground_truth=lambda source: True)
    assert len(skipped.rows) == 1 and skipped.skipped == 1


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="the dataset is empty"):
        load_rows([str(empty)])
    with pytest.raises(DataError, match="does not exist"):
        load_rows([str(tmp_path / "nope.jsonl")])
    with pytest.raises(DataError, match="unsupported data file type '.csv'"):
        (tmp_path / "d.csv").write_text("a,b\n")
        load_rows([str(tmp_path / "d.csv")])


def _encoded(n):
    import numpy as np
    import torch

    return {"tensors": {"input_ids": torch.arange(n).unsqueeze(-1)}, "non_tensors": {"uid": np.arange(n)}}


def test_loader_is_seeded_and_resumable():
    a = PromptLoader(_encoded(10), 3, shuffle=True, seed=5)
    first = [a.next_batch()["input_ids"].flatten().tolist() for _ in range(5)]  # crosses an epoch boundary
    b = PromptLoader(_encoded(10), 3, shuffle=True, seed=5)
    assert [b.next_batch()["input_ids"].flatten().tolist() for _ in range(5)] == first
    epoch0 = sorted(sum(first[:3], []))
    assert len(set(epoch0)) == 9  # one epoch: 3 full batches, no repeats, ragged tail dropped
    c = PromptLoader(_encoded(10), 3, shuffle=True, seed=5)
    c.next_batch(), c.next_batch()
    state = c.state_dict()
    d = PromptLoader(_encoded(10), 3, shuffle=True, seed=5)
    d.load_state_dict(state)
    assert [d.next_batch()["input_ids"].flatten().tolist() for _ in range(3)] == first[2:]
    assert PromptLoader(_encoded(10), 3, shuffle=True, seed=6).next_batch()["input_ids"].flatten().tolist() != first[0]


def test_loader_needs_a_full_batch():
    with pytest.raises(DataError, match="fewer than data.train_batch_size=8"):
        PromptLoader(_encoded(5), 8, shuffle=False, seed=0)


def test_a_line_that_is_not_utf8_is_named_or_skipped(tmp_path):
    good = json.dumps({"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2"}).encode()
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(
        b"\xef\xbb\xbf"
        + good
        + b"\n"
        + '{"prompt": "caf\u00e9", "data_source": "arithmetic"}'.encode("latin-1")
        + b"\n"
        + good
        + b"\n"
    )
    with pytest.raises(
        DataError,
        match=rf"{f}, line 2: not UTF-8 text \(byte 0xe9, the line's byte 16\); save the file as "
        r"UTF-8.*data.skip_invalid=true",
    ):
        load_rows([str(f)])
    ds = load_rows([str(f)], skip_invalid=True)  # the byte-order mark of line 1 is no problem
    assert len(ds.rows) == 2 and ds.skipped == 1 and "line 2: not UTF-8" in ds.problems[0]


def test_a_parquet_file_that_is_not_parquet_is_named_or_skipped(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2"}])
    fake = tmp_path / "rows.parquet"
    fake.write_text('{"prompt": "1+1=", "data_source": "arithmetic"}\n')
    with pytest.raises(DataError, match=rf"{fake}: not a readable Parquet file \(.*\).*data.skip_invalid=true"):
        load_rows([str(good), str(fake)])
    ds = load_rows([str(good), str(fake)], skip_invalid=True)
    assert len(ds.rows) == 1 and ds.skipped == 1 and str(fake) in ds.problems[0]


# -- data.apply_chat_template_kwargs ------------------------------------------------------------------

# a Qwen3-style switch: with enable_thinking false the template closes an empty thinking block ("+"
# here, as the tiny tokenizer knows only digits, '+' and '=')
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}+{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    from armor_core.models.loading import build_char_tokenizer

    tok = build_char_tokenizer("0123456789+=")
    tok.chat_template = THINKING_TEMPLATE
    return tok


def _encoded_prompts(tmp_path, tokenizer, *overrides):
    from armor_core.config.schema import load_config
    from armor_core.loop.data import prepare_data

    f = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"prompt": [{"role": "user", "content": "12+3"}], "data_source": "arithmetic", "ground_truth": "15"}],
    )
    cfg = load_config(None, [f"data.train_files=[{f}]", "data.max_prompt_length=16", *overrides])
    train, _ = prepare_data(cfg, tokenizer=tokenizer)
    ids = train.encoded["tensors"]["input_ids"][0]
    return tokenizer.decode(ids[ids != tokenizer.pad_token_id].tolist(), skip_special_tokens=True)


def test_chat_template_kwargs_from_the_config_reach_the_template(tmp_path, chat_tokenizer):
    assert _encoded_prompts(tmp_path, chat_tokenizer) == "12+3="
    assert (
        _encoded_prompts(tmp_path, chat_tokenizer, "data.apply_chat_template_kwargs={enable_thinking: false}")
        == "12+3=+"
    )
    assert (
        _encoded_prompts(tmp_path, chat_tokenizer, "data.apply_chat_template_kwargs={enable_thinking: true}") == "12+3="
    )
    # an apply_chat_template parameter passes too: without the generation prompt there is no '='
    assert (
        _encoded_prompts(tmp_path, chat_tokenizer, "data.apply_chat_template_kwargs={add_generation_prompt: false}")
        == "12+3"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ("{enable_thinkng: false}", "'enable_thinkng': not read by this tokenizer's chat template"),
        ("{tokenize: true}", "apply_chat_template_kwargs.tokenize: ARMOR renders the template to text"),
    ],
)
def test_chat_template_kwargs_that_would_do_nothing_are_refused(tmp_path, chat_tokenizer, kwargs, message):
    with pytest.raises(DataError, match=message):
        _encoded_prompts(tmp_path, chat_tokenizer, f"data.apply_chat_template_kwargs={kwargs}")
