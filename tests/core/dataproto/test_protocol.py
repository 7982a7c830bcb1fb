"""DataProto: construction checks, row and column operations, save/load and pickling.

Expected values are written out by hand from ``_batch``: row ``i`` has input_ids ``[3i, 3i+1, 3i+2]``,
score ``i / 2``, mask ``i % 3 == 0`` and prompt ``f"p{i}"``.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

from armor_core import DataProto, DataProtoItem


def _batch(n: int = 10) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(3 * n).reshape(n, 3),
            "score": torch.arange(n, dtype=torch.float32) / 2,
            "mask": torch.arange(n) % 3 == 0,
        },
        non_tensors={"prompt": np.array([f"p{i}" for i in range(n)], dtype=object)},
        meta_info={"task": "chat"},
    )


def _ids(data: DataProto) -> list[int]:
    """Row numbers of ``_batch`` rows, read back from input_ids."""
    return (data["input_ids"][:, 0] // 3).tolist()


def test_issue_example_runs_and_round_trips():
    data = DataProto.from_dict(
        tensors={"input_ids": torch.randint(0, 1000, (16, 32)), "attention_mask": torch.ones(16, 32)},
        non_tensors={"prompts": np.array(["Hello"] * 16, dtype=object)},
        meta_info={"task": "chat"},
    )
    batch = data[0:8]
    chunks = data.chunk(4)
    combined = DataProto.concat(chunks)
    assert len(batch) == 8 and [len(c) for c in chunks] == [4, 4, 4, 4]
    assert torch.equal(combined["input_ids"], data["input_ids"])
    assert combined["prompts"].tolist() == ["Hello"] * 16 and combined.meta_info == {"task": "chat"}


# -- construction and validation -------------------------------------------------------------------


def test_mismatched_tensor_batch_sizes_name_both_keys_and_sizes():
    with pytest.raises(ValueError, match=r"tensor 'attention_mask' has batch size 15 but tensor 'input_ids' has 16"):
        DataProto.from_dict(tensors={"input_ids": torch.zeros(16, 4), "attention_mask": torch.zeros(15, 4)})


def test_mismatched_non_tensor_length_is_named():
    with pytest.raises(ValueError, match=r"non-tensor 'prompt' has length 3 but tensor 'x' has 4"):
        DataProto.from_dict(tensors={"x": torch.zeros(4)}, non_tensors={"prompt": np.array(["a", "b", "c"])})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"tensors": {"x": [1, 2]}}, TypeError, r"tensor 'x' is a list; expected torch.Tensor"),
        ({"tensors": {"x": np.zeros(2)}}, TypeError, r"tensor 'x' is a ndarray.*non_tensors"),
        ({"non_tensors": {"x": torch.zeros(2)}}, TypeError, r"non-tensor 'x' is a Tensor.*pass it in tensors"),
        ({"non_tensors": {"x": 3}}, TypeError, r"non-tensor 'x' is a int; expected numpy.ndarray"),
        ({"tensors": {"x": torch.tensor(1.0)}}, ValueError, r"tensor 'x' is 0-dimensional.*meta_info"),
        ({"tensors": [torch.zeros(2)]}, TypeError, r"tensors must be a dict, got list"),
        ({"tensors": {1: torch.zeros(2)}}, TypeError, r"column names must be str"),
        (
            {"tensors": {"x": torch.zeros(2)}, "non_tensors": {"x": [1, 2]}},
            ValueError,
            r"'x' is both a tensor and a non-tensor",
        ),
    ],
)
def test_wrong_types_are_explained(kwargs, error, message):
    with pytest.raises(error, match=message):
        DataProto.from_dict(**kwargs)


def test_list_non_tensor_becomes_one_object_per_row():
    data = DataProto.from_dict(non_tensors={"ragged": [[1, 2], [3]], "even": [[1, 2], [3, 4]], "s": ("ab", "c")})
    assert len(data) == 2
    assert data["even"].dtype == object and data["even"].shape == (2,) and data["even"][1] == [3, 4]
    assert data["ragged"][0] == [1, 2] and data["s"].tolist() == ["ab", "c"]


def test_empty_dataproto_has_batch_size_zero():
    data = DataProto(meta_info={"a": 1})
    assert len(data) == 0 and data.batch_size == 0 and data.keys() == [] and data.meta_info == {"a": 1}


def test_from_single_dict_splits_by_type():
    data = DataProto.from_single_dict(
        {"ids": torch.zeros(2, 3), "text": ["a", "b"], "arr": np.array([1, 2])}, meta_info={"k": 1}
    )
    assert list(data.tensors) == ["ids"] and list(data.non_tensors) == ["text", "arr"]
    assert data["text"].dtype == object and data.meta_info == {"k": 1}
    with pytest.raises(TypeError, match=r"'temperature' is a float.*meta_info"):
        DataProto.from_single_dict({"ids": torch.zeros(2), "temperature": 0.7})


def test_corruption_through_the_dicts_is_caught_at_the_next_operation():
    data = _batch(4)
    data.tensors["bad"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"tensor 'bad' has batch size 3 but tensor 'input_ids' has 4"):
        data.chunk(2)


def test_constructor_copies_the_dicts_but_not_the_columns():
    tensors = {"x": torch.zeros(2)}
    data = DataProto(tensors)
    tensors["y"] = torch.zeros(5)
    assert data.keys() == ["x"] and data["x"] is tensors["x"]


# -- column access -------------------------------------------------------------------------------


def test_len_keys_contains():
    data = _batch()
    assert len(data) == data.batch_size == 10
    assert data.keys() == ["input_ids", "score", "mask", "prompt"]
    assert "prompt" in data and "score" in data and "task" not in data  # meta_info keys are not columns


def test_str_index_returns_the_column_itself():
    data = _batch()
    assert data["input_ids"] is data.tensors["input_ids"] and data["prompt"] is data.non_tensors["prompt"]
    with pytest.raises(KeyError, match=r"no column 'input_id'\. Did you mean 'input_ids'\?"):
        data["input_id"]


def test_setitem_adds_and_checks_length():
    data = _batch(4)
    data["values"] = torch.ones(4)
    data["tags"] = ["a", "b", "c", "d"]
    assert data.tensors["values"].tolist() == [1, 1, 1, 1] and data.non_tensors["tags"].dtype == object
    with pytest.raises(
        ValueError, match=r"DataProto\['bad'\] = \.\.\.: tensor 'bad' has batch size 3 but tensor 'input_ids' has 4"
    ):
        data["bad"] = torch.ones(3)
    assert "bad" not in data
    with pytest.raises(ValueError, match=r"'score' is already a tensor column"):
        data["score"] = np.zeros(4)
    with pytest.raises(TypeError, match=r"takes a column name"):
        data[0] = torch.ones(4)
    data["score"] = torch.zeros(4)  # replacing keeps the kind
    assert data["score"].tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"batch size 2"):  # a failed replacement keeps the old column
        data["score"] = torch.zeros(2)
    assert data["score"].shape == (4,)


def test_setitem_on_an_empty_dataproto_sets_the_batch_size():
    data = DataProto()
    data["x"] = torch.zeros(7, 2)
    assert len(data) == 7


def test_delitem():
    data = _batch(2)
    del data["score"], data["prompt"]
    assert data.keys() == ["input_ids", "mask"]
    with pytest.raises(KeyError, match="no column 'score'"):
        del data["score"]


# -- rows ----------------------------------------------------------------------------------------


def test_int_index_is_the_row_without_its_batch_dimension():
    data = _batch()
    row = data[3]
    assert isinstance(row, DataProtoItem) and row.meta_info is data.meta_info
    assert row["input_ids"].tolist() == [9, 10, 11] and row["prompt"] == "p3" and "prompt" in row and "nope" not in row
    assert row.batch is row.tensors and row.non_tensor_batch is row.non_tensors
    row["input_ids"][0] = -1  # a view, as a tensor's row is
    assert data["input_ids"][3, 0] == -1
    assert (
        data[-1]["input_ids"][0] == 27
        and data[np.int64(2)]["input_ids"][0] == 6
        and data[torch.tensor(4)]["input_ids"][0] == 12
    )
    one = data[3:4]
    assert isinstance(one, DataProto) and len(one) == 1 and one["prompt"].tolist() == ["p3"]
    with pytest.raises(KeyError, match=r"no column 'promt'\. Did you mean 'prompt'\?"):
        row["promt"]
    with pytest.raises(IndexError, match=r"row 10 is out of range for batch size 10"):
        data[10]
    with pytest.raises(IndexError, match=r"row -11 is out of range"):
        data[-11]
    with pytest.raises(TypeError, match=r"cannot index rows with bool"):
        data[True]


def test_slice_is_a_view_and_meta_info_a_shallow_copy():
    data = _batch()
    data.meta_info["metrics"] = {"loss": 1.0}
    part = data[2:5]
    assert _ids(part) == [2, 3, 4] and part["prompt"].tolist() == ["p2", "p3", "p4"]
    part["score"][0] = 100.0
    assert data["score"][2] == 100.0  # same memory, like a torch slice
    part.meta_info["new"] = 1
    part.meta_info["metrics"]["acc"] = 0.5
    assert "new" not in data.meta_info and data.meta_info["metrics"] == {"loss": 1.0, "acc": 0.5}


def test_slices_with_steps():
    data = _batch()
    assert _ids(data[1:8:3]) == [1, 4, 7]
    assert _ids(data[::-3]) == [9, 6, 3, 0] and data[::-3]["prompt"].tolist() == ["p9", "p6", "p3", "p0"]
    assert _ids(data[8:20]) == [8, 9]


@pytest.mark.parametrize(
    "index", [[4, 0, 4, -1], np.array([4, 0, 4, -1]), torch.tensor([4, 0, 4, -1]), range(4, -2, -4)]
)
def test_integer_arrays_pick_rows_in_order_as_a_copy(index):
    data = _batch()
    picked = data[index]
    expected = [4, 0, 4, 9] if not isinstance(index, range) else [4, 0]
    assert _ids(picked) == expected and picked["prompt"].tolist() == [f"p{i}" for i in expected]
    picked["score"][0] = -1.0
    assert data["score"][4] == 2.0


@pytest.mark.parametrize("mask", [np.arange(10) % 4 == 1, torch.arange(10) % 4 == 1, [i % 4 == 1 for i in range(10)]])
def test_boolean_masks(mask):
    picked = _batch()[mask]
    assert _ids(picked) == [1, 5, 9] and picked["mask"].tolist() == [False, False, True]


def test_empty_selections_keep_the_columns():
    data = _batch()
    for empty in (data[[]], data[np.zeros(10, dtype=bool)], data[torch.tensor([], dtype=torch.long)], data[5:5]):
        assert len(empty) == 0 and empty["input_ids"].shape == (0, 3) and empty["prompt"].shape == (0,)
        assert empty.keys() == data.keys() and empty.meta_info == {"task": "chat"}


@pytest.mark.parametrize(
    "index, error, message",
    [
        ([0, 10], IndexError, r"row 10 is out of range for batch size 10"),
        ([-11], IndexError, r"row -11 is out of range"),
        (np.ones(9, dtype=bool), IndexError, r"boolean mask has 9 entries but the batch has 10 rows"),
        (torch.zeros(0, dtype=torch.bool), IndexError, r"boolean mask has 0 entries but the batch has 10 rows"),
        ([0.5, 1.0], TypeError, r"must be integers or booleans, got dtype float64"),
        ((0, 1), TypeError, r"cannot index rows with tuple"),
        (True, TypeError, r"cannot index rows with bool"),
        (np.zeros((2, 2), dtype=int), IndexError, r"must be 1-D, got shape \(2, 2\)"),
    ],
)
def test_bad_row_indices(index, error, message):
    with pytest.raises(error, match=message):
        _batch()[index]


def test_iteration_yields_rows():
    assert [row["prompt"] for row in _batch(3)] == ["p0", "p1", "p2"]
    assert all(isinstance(row, DataProtoItem) for row in _batch(2))


# -- select, pop, rename, union --------------------------------------------------------------------


def test_select_gives_exactly_the_named_columns_shared():
    data = _batch()
    data.meta_info["temperature"] = 1.0
    sub = data.select(tensor_keys=["score", "input_ids"], meta_keys="task")  # one str is one key
    assert sub.keys() == ["score", "input_ids"] and sub.meta_info == {"task": "chat"} and sub["score"] is data["score"]
    only_text = data.select(non_tensor_keys=["prompt"])
    assert only_text.keys() == ["prompt"] and only_text.meta_info == {"task": "chat", "temperature": 1.0}
    assert data.select().keys() == [] and data.select().meta_info == data.meta_info
    assert data.select(meta_keys=[]).meta_info == {} and len(data.select(tensor_keys="mask")) == 10
    with pytest.raises(KeyError, match=r"DataProto.select: no tensor 'scores'\. Did you mean 'score'\?"):
        data.select(tensor_keys=["scores"])
    with pytest.raises(KeyError, match=r"DataProto.select: no meta_info key 'tsk'"):
        data.select(meta_keys=["tsk"])


def test_pop_removes_and_returns():
    data = _batch()
    popped = data.pop(tensor_keys=["score", "mask"], non_tensor_keys="prompt", meta_keys=["task"])
    assert popped.keys() == ["score", "mask", "prompt"] and popped.meta_info == {"task": "chat"} and len(popped) == 10
    assert data.keys() == ["input_ids"] and data.meta_info == {}
    assert data.pop().keys() == [] and data.keys() == ["input_ids"]  # None pops nothing


def test_pop_with_a_missing_key_removes_nothing():
    data = _batch()
    with pytest.raises(KeyError, match=r"DataProto.pop: no non-tensor 'prompts'"):
        data.pop(tensor_keys=["score"], non_tensor_keys=["prompts"])
    assert data.keys() == ["input_ids", "score", "mask", "prompt"]


def test_rename_in_place_including_a_swap():
    data = _batch(2)
    tensors = data.tensors
    assert data.rename(["score", "prompt"], ["reward", "question"]) is data
    assert data.keys() == ["input_ids", "reward", "mask", "question"] and data.tensors is tensors
    data.rename(["reward", "mask"], ["mask", "reward"])
    assert data["mask"].tolist() == [0.0, 0.5] and data["reward"].tolist() == [True, False]


@pytest.mark.parametrize(
    "old, new, error, message",
    [
        ("nope", "x", KeyError, r"no column 'nope'"),
        ("score", "mask", ValueError, r"'mask' is already a column"),
        (["score", "mask"], ["x"], ValueError, r"2 old names .* but 1 new names"),
        (["score", "mask"], ["x", "x"], ValueError, r"duplicate name"),
    ],
)
def test_rename_errors_leave_the_batch_unchanged(old, new, error, message):
    data = _batch(2)
    with pytest.raises(error, match=message):
        data.rename(old, new)
    assert data.keys() == ["input_ids", "score", "mask", "prompt"]


def test_union_adds_columns_and_accepts_equal_values():
    data = _batch(3)
    nan_score = torch.tensor([float("nan"), 1.0, 2.0])
    data["score"] = nan_score
    other = DataProto.from_dict(
        tensors={"values": torch.ones(3), "score": nan_score.clone()},  # equal, NaN included
        non_tensors={"prompt": np.array(["p0", "p1", "p2"], dtype=object), "gt": np.array([1, 2, 3])},
        meta_info={"task": "chat", "step": 4},
    )
    assert data.union(other) is data
    assert data.keys() == ["input_ids", "score", "mask", "values", "prompt", "gt"]
    assert data.meta_info == {"task": "chat", "step": 4} and data["gt"].tolist() == [1, 2, 3]
    assert len(data.union(DataProto(meta_info={"x": 1}))) == 3  # a batch without columns only adds meta_info


@pytest.mark.parametrize(
    "other, message",
    [
        (DataProto({"score": torch.tensor([0.0, 0.5, 1.5])}), r"tensor 'score' differs"),
        (DataProto({"score": torch.tensor([0, 0, 1])}), r"tensor 'score' differs"),  # same values, other dtype
        (DataProto(non_tensors={"prompt": ["p0", "p1", "px"]}), r"non-tensor 'prompt' differs"),
        (DataProto(meta_info={"task": "math"}), r"meta_info key 'task' differs"),
        (DataProto({"values": torch.ones(4)}), r"batch sizes differ \(3 rows in self, 4 in other\)"),
        (DataProto(non_tensors={"score": [1, 2, 3]}), r"'score' is a tensor column in one batch and a non-tensor"),
    ],
)
def test_union_conflicts_are_errors_and_change_nothing(other, message):
    data = _batch(3)
    with pytest.raises(ValueError, match=message):
        data.union(other)
    assert data.keys() == ["input_ids", "score", "mask", "prompt"] and data.meta_info == {"task": "chat"}


# -- chunk, split, concat, repeat, reorder, pad ----------------------------------------------------


def test_chunk_uneven_gives_the_first_chunks_one_more_row():
    chunks = _batch(10).chunk(4)
    assert [_ids(c) for c in chunks] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [c["prompt"].tolist() for c in chunks][2] == ["p6", "p7"]
    assert [len(c) for c in _batch(3).chunk(3)] == [1, 1, 1]
    assert [len(c) for c in DataProto({"x": torch.zeros(0)}).chunk(1)] == [0]


def test_chunk_errors():
    with pytest.raises(
        ValueError, match=r"chunk\(4\) of a batch of 3 rows would leave 1 chunks empty; call pad_to_divisor\(4\)"
    ):
        _batch(3).chunk(4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"n must be a positive int"):
            _batch(3).chunk(bad)


def test_split_last_piece_is_shorter():
    assert [_ids(p) for p in _batch(10).split(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert _batch(10)[0:0].split(3) == []
    with pytest.raises(ValueError, match="size must be a positive int"):
        _batch().split(0)


def test_concat_inverts_chunk_and_merges_metrics():
    data = _batch(10)
    chunks = data.chunk(3)
    chunks[0].meta_info["metrics"] = {"loss": 1.0, "acc": 0.5}
    chunks[2].meta_info["metrics"] = {"loss": 3.0}
    combined = DataProto.concat(chunks)
    for key in data.keys():
        assert np.array_equal(np.asarray(combined[key]), np.asarray(data[key])), key
    assert combined.meta_info == {
        "task": "chat",
        "metrics": {"loss": 2.0, "acc": 0.5},
    }  # merge_metrics: mean over the items that have it
    assert "metrics" not in DataProto.concat(data.chunk(2)).meta_info


@pytest.mark.parametrize(
    "change, error, message",
    [
        (
            lambda d: d.meta_info.update(task="math"),
            ValueError,
            r"meta_info\['task'\] is 'math' in item 1 but 'chat' in item 0",
        ),
        (
            lambda d: d.meta_info.update(step=1),
            ValueError,
            r"item 1 has meta_info keys \['step', 'task'\] but item 0 has \['task'\]",
        ),
        (
            lambda d: d.pop(tensor_keys="mask"),
            ValueError,
            r"item 1 has different tensor columns from item 0: missing \['mask'\], extra \[\]",
        ),
        (
            lambda d: d.__setitem__("score", d["score"].double()),
            ValueError,
            r"tensor 'score' is float64 \(\*\) on cpu in item 1 but float32",
        ),
        (
            lambda d: d.__setitem__("input_ids", d["input_ids"][:, :2]),
            ValueError,
            r"tensor 'input_ids' is int64 \(\*, 2\)",
        ),
        (
            lambda d: d.__setitem__("score", d["score"].to("meta")),
            ValueError,
            r"on meta in item 1 but float32 \(\*\) on cpu",
        ),
        (lambda d: d.meta_info.update(metrics=[1.0]), TypeError, r"item 1 meta_info\['metrics'\] is a list"),
    ],
)
def test_concat_refuses_mismatched_items(change, error, message):
    first, second = _batch(4).chunk(2)
    change(second)
    with pytest.raises(error, match=message):
        DataProto.concat([first, second])


def test_concat_argument_errors():
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])
    with pytest.raises(TypeError, match="item 1 is a dict"):
        DataProto.concat([_batch(2), {"x": 1}])
    a, b = DataProto(non_tensors={"x": np.zeros((2, 2))}), DataProto(non_tensors={"x": np.zeros((2, 3))})
    with pytest.raises(ValueError, match=r"non-tensor 'x' cannot be stacked \(shapes \[\(2, 2\), \(2, 3\)\]\)"):
        DataProto.concat([a, b])


def test_repeat_interleaved_and_tiled():
    data = _batch(3)
    inter = data.repeat(2)
    tiled = data.repeat(2, interleave=False)
    assert _ids(inter) == [0, 0, 1, 1, 2, 2] and inter["prompt"].tolist() == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert _ids(tiled) == [0, 1, 2, 0, 1, 2] and tiled["prompt"].tolist() == ["p0", "p1", "p2", "p0", "p1", "p2"]
    assert _ids(data.repeat(1)) == [0, 1, 2] and len(data) == 3
    with pytest.raises(ValueError, match="n must be a positive int"):
        data.repeat(0)


def test_reorder_is_in_place():
    data = _batch(4)
    tensors = data.tensors
    assert data.reorder([2, 0, 3, 1]) is data and data.tensors is tensors
    assert _ids(data) == [2, 0, 3, 1] and data["prompt"].tolist() == ["p2", "p0", "p3", "p1"]
    data.reorder(torch.tensor([1, 3, 0, 2]))
    assert _ids(data) == [0, 1, 2, 3]
    for bad in ([0, 0, 1, 2], [0, 1, 2]):
        with pytest.raises(ValueError, match=r"needs a permutation of the 4 rows"):
            data.reorder(bad)
    assert _ids(data) == [0, 1, 2, 3]


def test_pad_to_divisor_repeats_rows_from_the_start_and_unpad_inverts():
    data = _batch(10)
    padded, pad = data.pad_to_divisor(4)
    assert pad == 2 and _ids(padded) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert padded["prompt"].tolist()[-2:] == ["p0", "p1"]
    restored = padded.unpad(pad)
    assert _ids(restored) == list(range(10)) and restored["prompt"].tolist() == data["prompt"].tolist()
    small, pad = _batch(3).pad_to_divisor(8)  # more padding than rows: cycle
    assert pad == 5 and _ids(small) == [0, 1, 2, 0, 1, 2, 0, 1]
    same, pad = data.pad_to_divisor(5)
    assert pad == 0 and _ids(same) == list(range(10)) and _ids(same.unpad(0)) == list(range(10))
    with pytest.raises(ValueError, match=r"pad_size must be an int in \[0, 10\]"):
        data.unpad(11)


def test_to_moves_tensors_and_leaves_self_alone():
    data = _batch(2)
    moved = data.to("meta")  # a real device move that needs no GPU
    assert moved["score"].device.type == "meta" and data["score"].device.type == "cpu"
    assert moved["prompt"] is data["prompt"] and moved.meta_info == data.meta_info
    assert "score: (2,) float32 on meta" in repr(moved)


def test_repr_shows_keys_shapes_dtypes():
    text = repr(_batch(4))
    assert text.startswith("DataProto(batch_size=4")
    for part in (
        "input_ids: (4, 3) int64",
        "score: (4,) float32",
        "mask: (4,) bool",
        "prompt: (4,) object",
        "meta_info  ['task']",
    ):
        assert part in text
    broken = _batch(4)
    broken.tensors["x"] = torch.zeros(3)
    assert "batch_size=invalid" in repr(broken)


# -- save / load -----------------------------------------------------------------------------------


def _rich_batch() -> DataProto:
    base = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    return DataProto.from_dict(
        tensors={
            "x": base,
            "x_tail": base[:, 1:],
            "bf": torch.tensor([1.5, -2.0, 0.25, 3.0], dtype=torch.bfloat16),
            "mask": torch.tensor([True, False, True, False]),
            "ids": torch.arange(4),
        },
        non_tensors={
            "text": np.array(["héllo", "", "multi\nline", "✓"], dtype=object),
            "fixed": np.array(["a", "bb", "ccc", "d"]),
            "gt": np.array([1, 2, 3, 4], dtype=np.int32),
            "grid": np.arange(8, dtype=np.float64).reshape(4, 2),
            "rows": [[1, 2], [], None, {"k": "v"}],
        },
        meta_info={"task": "chat", "metrics": {"loss": [1.0, float("nan")]}, "n": 3},
    )


def test_save_load_round_trip(tmp_path):
    data = _rich_batch()[0:4]  # slices share storage; save must still work
    data.save(tmp_path / "batch.safetensors")
    loaded = DataProto.load(tmp_path / "batch.safetensors")
    assert loaded.keys() == data.keys()
    for key, t in data.tensors.items():
        assert loaded[key].dtype == t.dtype and torch.equal(loaded[key], t), key
    for key, arr in data.non_tensors.items():
        assert loaded[key].dtype == arr.dtype and loaded[key].shape == arr.shape, key
        assert loaded[key].tolist() == arr.tolist(), key
    assert loaded["text"].tolist() == ["héllo", "", "multi\nline", "✓"] and loaded["mask"].tolist() == [
        True,
        False,
        True,
        False,
    ]
    assert loaded.meta_info["task"] == "chat" and loaded.meta_info["metrics"]["loss"][0] == 1.0
    assert np.isnan(loaded.meta_info["metrics"]["loss"][1])


def test_load_never_unpickles(tmp_path, monkeypatch):
    _rich_batch().save(tmp_path / "b.safetensors")

    def refuse(*args, **kwargs):
        raise AssertionError("load() must not unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    assert len(DataProto.load(tmp_path / "b.safetensors")) == 4


@pytest.mark.parametrize(
    "data, message",
    [
        (
            DataProto(meta_info={"shape": (1, 2)}),
            r"meta_info\['shape'\] is a tuple, which cannot be saved without pickle",
        ),
        (DataProto(meta_info={"m": {"x": np.float32(1)}}), r"meta_info\['m'\]\['x'\] is a float32"),
        (DataProto(meta_info={"m": {1: 2}}), r"meta_info\['m'\] has key 1 \(int\); JSON keys must be str"),
        (DataProto(non_tensors={"ids": [[1], np.array([2])]}), r"non-tensor 'ids' element 1 is a ndarray"),
    ],
)
def test_save_refuses_what_json_would_change(tmp_path, data, message):
    with pytest.raises(TypeError, match=message):
        data.save(tmp_path / "x.safetensors")


def test_save_load_edge_cases(tmp_path):
    x = torch.arange(6).reshape(3, 2)
    DataProto({"a": x, "b": x}).save(tmp_path / "same.safetensors")  # one tensor under two names
    loaded = DataProto.load(tmp_path / "same.safetensors")
    assert torch.equal(loaded["a"], x) and torch.equal(loaded["b"], x)
    _batch()[[]].save(tmp_path / "empty.safetensors")
    empty = DataProto.load(tmp_path / "empty.safetensors")
    assert len(empty) == 0 and empty["input_ids"].shape == (0, 3) and empty["prompt"].dtype == object
    assert DataProto.load(tmp_path / "empty.safetensors", device="meta")["score"].device.type == "meta"


def test_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.safetensors has no 'armor.dataproto/1' manifest"):
        DataProto.load(tmp_path / "model.safetensors")
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ValueError, match=r"batch.pkl is not a safetensors file"):
        DataProto.load(tmp_path / "batch.pkl")


# -- pickling and copying --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip(protocol):
    data = _rich_batch()
    data["grad"] = torch.ones(4, requires_grad=True)
    data["transposed"] = torch.arange(8).reshape(2, 4).T  # not contiguous
    loaded = pickle.loads(pickle.dumps(data, protocol=protocol))
    for key, t in data.tensors.items():
        assert loaded[key].dtype == t.dtype and torch.equal(loaded[key], t), key
    assert loaded["grad"].requires_grad and not loaded["x"].requires_grad
    assert loaded["text"].tolist() == data["text"].tolist() and loaded.meta_info["n"] == 3
    empty = pickle.loads(pickle.dumps(data[[]], protocol=protocol))
    assert len(empty) == 0 and empty["x"].shape == (0, 3)


def test_pickle_sends_tensors_out_of_band_and_only_the_viewed_rows():
    from armor_core.dataproto.io import INLINE_BYTES

    data = DataProto({"ids": torch.arange(64 * 256).reshape(64, 256), "mask": torch.ones(64, 128, dtype=torch.bool)})
    assert 64 * 128 <= INLINE_BYTES < 64 * 256 * 8
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert [memoryview(b).nbytes for b in buffers] == [64 * 256 * 8]  # the large tensor's raw bytes, nothing else
    assert 64 * 128 < len(payload) < 64 * 128 + 1000  # the small one in-band, as its bytes
    loaded = pickle.loads(payload, buffers=buffers)
    assert torch.equal(loaded["ids"], data["ids"]) and torch.equal(loaded["mask"], data["mask"])
    # one row of 256 int64 + 128 bool is 2176 bytes; torch would pickle the whole 139,264-byte storages
    assert len(pickle.dumps(data[5:6])) < 3000 < 139_264 < len(pickle.dumps(dict(data[5:6].tensors)))


def test_unpickled_tensors_are_writable_even_from_read_only_buffers():
    data = DataProto({"x": torch.zeros(4), "big": torch.zeros(4, 8192)})  # in-band and out-of-band
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    read_only = [memoryview(bytes(b)) for b in buffers]  # what Ray's shared memory looks like
    assert len(read_only) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when wrapping a non-writable array
        loaded = pickle.loads(payload, buffers=read_only)
    loaded["x"] += 1
    loaded["big"] += 1
    assert loaded["x"].tolist() == [1, 1, 1, 1] and bool((loaded["big"] == 1).all())


def test_copy_shares_columns_and_deepcopy_does_not():
    data = _batch(2)
    shallow, deep = copy.copy(data), copy.deepcopy(data)
    assert shallow["score"] is data["score"] and shallow.meta_info is not data.meta_info
    deep["score"][0] = 9.0
    assert data["score"][0] == 0.0 and deep["prompt"].tolist() == ["p0", "p1"]


# -- verl's names: code written against verl's DataProto runs as is -----------------------------------


def _verl_style_response_mask(data):
    # as verl's trainer computes it: the response part of the attention mask
    response_length = data.batch["responses"].size(1)
    return data.batch["attention_mask"][:, -response_length:]


def _verl_style_reward(data):
    # a custom reward manager's __call__ in verl's style: a score on each response's last valid token
    reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    prompt_length = data.batch["prompts"].shape[-1]
    valid_response_length = data.batch["attention_mask"][:, prompt_length:].sum(dim=-1)
    for i in range(len(data)):
        data_source = data.non_tensor_batch["data_source"][i]
        ground_truth = data.non_tensor_batch["reward_model"][i]["ground_truth"]
        response_ids = data.batch["responses"][i][: valid_response_length[i]]
        score = 1.0 if data_source == "toy" and int(response_ids.sum()) == ground_truth else 0.0
        reward_tensor[i, valid_response_length[i] - 1] = score
    return reward_tensor


def _verl_style_data_hook(data):
    # what a verl data hook does to a batch before the update: uids, a response mask, token counts
    data.non_tensor_batch["uid"] = np.array([f"u{i // 2}" for i in range(len(data))], dtype=object)
    data.batch["response_mask"] = _verl_style_response_mask(data)
    data.meta_info["global_token_num"] = torch.sum(data.batch["attention_mask"], dim=-1).tolist()
    return data


def _generated_batch() -> DataProto:
    """Four rows laid out as a rollout returns them (verl's layout): prompts left-padded to 3
    tokens, responses right-padded to 4."""
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 0, 4], [1, 2, 3]])
    responses = torch.tensor([[2, 3, 0, 0], [1, 1, 1, 1], [9, 0, 0, 0], [4, 4, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([(prompts != 0).long(), response_mask], 1),
        },
        non_tensors={
            "data_source": ["toy", "toy", "other", "toy"],
            "reward_model": [{"ground_truth": 5}, {"ground_truth": 4}, {"ground_truth": 9}, {"ground_truth": 7}],
        },
        meta_info={"temperature": 1.0},
    )


def test_verl_style_reward_manager_and_data_hook_run_unchanged():
    data = _generated_batch()
    # rows 0 and 1 are "toy" and their valid response tokens sum to the ground truth; row 2 is
    # another source; row 3 sums to 8, not 7
    expected = torch.zeros(4, 4)
    expected[0, 1] = expected[1, 3] = 1.0
    assert torch.equal(_verl_style_reward(data), expected)

    data = _verl_style_data_hook(data)
    assert data["uid"].tolist() == ["u0", "u0", "u1", "u1"]  # written through the alias, read by ARMOR's names
    assert torch.equal(data.tensors["response_mask"], data["attention_mask"][:, 3:])
    assert data.meta_info["global_token_num"] == [4, 7, 2, 5]
    assert data.batch is data.tensors and data.non_tensor_batch is data.non_tensors


def test_verl_style_slicing_splitting_and_merging_keep_the_aliases():
    data = _generated_batch()
    head = data[:2]
    head.batch["responses"][0, 0] = 99  # a slice is a view, as in verl
    assert data.batch["responses"][0, 0] == 99
    assert len(head) == 2 and head.non_tensor_batch["data_source"].tolist() == ["toy", "toy"]
    chunks = data.chunk(2)
    assert [len(c) for c in chunks] == [2, 2]
    merged = DataProto.concat(chunks)
    assert torch.equal(merged.batch["input_ids"], data.batch["input_ids"])
    assert merged.non_tensor_batch["reward_model"].tolist() == data.non_tensor_batch["reward_model"].tolist()
    scores = DataProto.from_dict(tensors={"token_level_scores": _verl_style_reward(data)})
    data = data.union(scores)
    assert "token_level_scores" in data.batch and sorted(data.batch.keys())[-1] == "token_level_scores"
    picked = data[[3, 0]]
    assert picked.non_tensor_batch["data_source"].tolist() == ["toy", "toy"] and picked.meta_info == {
        "temperature": 1.0
    }
    # data[i] is verl's DataProtoItem: the row without its batch dimension
    assert data[2].batch["responses"].shape == (4,) and data[2].non_tensor_batch["data_source"] == "other"


def _verl_style_per_row_reward(data):
    # verl's per-row reward-manager loop: one DataProtoItem at a time
    reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    for i in range(len(data)):
        data_item = data[i]
        prompt_length = data_item.batch["prompts"].shape[-1]
        valid_response_length = int(data_item.batch["attention_mask"][prompt_length:].sum())
        response_ids = data_item.batch["responses"][:valid_response_length]
        ground_truth = data_item.non_tensor_batch["reward_model"]["ground_truth"]
        score = (
            1.0
            if data_item.non_tensor_batch["data_source"] == "toy" and int(response_ids.sum()) == ground_truth
            else 0.0
        )
        reward_tensor[i, valid_response_length - 1] = score
    return reward_tensor


def test_verl_per_row_reward_manager_and_verl_argument_names_run_unchanged():
    data = _generated_batch()
    assert torch.equal(_verl_style_per_row_reward(data), _verl_style_reward(data))
    assert torch.equal(_verl_style_per_row_reward(data).sum(-1), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    # verl's select: an omitted argument keeps every key of its kind
    sub = data.select(batch_keys=["responses"])
    assert sub.keys() == ["responses", "data_source", "reward_model"] and sub.meta_info == {"temperature": 1.0}
    assert sub.batch["responses"] is data.batch["responses"]
    deep = data.select(batch_keys=["responses"], non_tensor_batch_keys=[], meta_info_keys=[], deepcopy=True)
    assert (
        deep.keys() == ["responses"] and deep.meta_info == {} and deep.batch["responses"] is not data.batch["responses"]
    )
    popped = data.pop(batch_keys=["prompts"], non_tensor_batch_keys=["reward_model"])
    assert popped.keys() == ["prompts", "reward_model"] and "prompts" not in data and popped.meta_info == {}
    assert data.repeat(repeat_times=2, interleave=True).non_tensor_batch["data_source"].tolist() == [
        "toy",
        "toy",
        "toy",
        "toy",
        "other",
        "other",
        "toy",
        "toy",
    ]
    with pytest.raises(TypeError, match=r"use ARMOR's names .* or verl's .*not both"):
        data.select(tensor_keys=["responses"], non_tensor_batch_keys=["data_source"])
    with pytest.raises(TypeError, match=r"unknown argument 'batch_key'"):
        data.select(batch_key=["responses"])
    with pytest.raises(TypeError, match=r"unknown argument 'deepcopy'"):
        data.pop(batch_keys=["responses"], deepcopy=True)
    with pytest.raises(TypeError, match=r"takes the number of copies once"):
        data.repeat(2, repeat_times=2)
