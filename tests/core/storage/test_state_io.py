"""Worker states (optimizer, scheduler, RNG) go to disk as safetensors + JSON and come back exactly:
types, dtypes, shapes and bits; an actor checkpoint resumes from them, and from an older
checkpoint's ``.pt`` files only when the user allows it (``trainer.allow_legacy_pt_state``)."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch

from armor_core.storage.state_io import StateFileError, load_checkpoint_state, load_state, save_state


def _assert_same(a, b, where="state"):
    """Equal structure with equal types all the way down; tensors equal in dtype, shape and bits."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype} {tuple(a.shape)} -> {b.dtype} {tuple(b.shape)}"
        )
        bits = lambda t: t.reshape(-1).contiguous().view(torch.uint8)  # noqa: E731  (nan == nan, -0.0 != 0.0)
        assert torch.equal(bits(a), bits(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b) and [type(k) for k in a] == [type(k) for k in b], (
            f"{where}: keys {list(a)} -> {list(b)}"
        )
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} -> {b!r}"  # bit for bit: nan, -0.0
    else:
        assert a == b, where


def _adamw_after_steps(steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    for _ in range(steps):
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def test_an_adamw_state_dict_round_trips_with_int_keys_tuple_betas_and_0d_steps(tmp_path):
    model, opt, sched = _adamw_after_steps()
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "global_step": 3, "world_size": 1}
    save_state(state, tmp_path / "actor_state")
    back = load_state(tmp_path / "actor_state")
    _assert_same(state, back)
    assert list(back["optimizer"]["state"]) == [0, 1, 2, 3] and back["optimizer"]["param_groups"][0]["betas"] == (
        0.9,
        0.95,
    )
    assert back["optimizer"]["state"][0]["step"].shape == () and float(back["optimizer"]["state"][0]["step"]) == 3.0
    assert json.loads((tmp_path / "actor_state.json").read_text())["state"]["optimizer"]["state"]["__items__"][0] == [
        0,
        {
            "step": {"__tensor__": "optimizer/state/0/step"},
            "exp_avg": {"__tensor__": "optimizer/state/0/exp_avg"},
            "exp_avg_sq": {"__tensor__": "optimizer/state/0/exp_avg_sq"},
        },
    ]
    # the loaded state continues exactly as the original would have
    model2, opt2, _ = _adamw_after_steps(0)
    model2.load_state_dict(model.state_dict())
    opt2.load_state_dict(back["optimizer"])
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        m(x).pow(2).mean().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_the_rng_state_round_trips_and_replays_the_same_draws(tmp_path):
    torch.manual_seed(7)
    torch.rand(3)
    save_state({"torch_rng": torch.get_rng_state()}, tmp_path / "rng")
    want = torch.rand(5)
    rng = load_state(tmp_path / "rng")["torch_rng"]
    assert rng.dtype == torch.uint8 and rng.shape == torch.get_rng_state().shape
    torch.set_rng_state(rng)
    assert torch.equal(torch.rand(5), want)


def test_floats_and_scalars_come_back_exactly(tmp_path):
    state = {
        "floats": [float("nan"), float("inf"), float("-inf"), -0.0, 0.1, 1e-310, 1.7976931348623157e308],
        "nested": ({"__tuple__": 1, 5: None}, [True, "x", 2**40]),
        "empty": ({}, [], ()),
        -1: "negative key",
    }
    save_state(state, tmp_path / "s")
    _assert_same(state, load_state(tmp_path / "s"))
    assert math.isnan(load_state(tmp_path / "s")["floats"][0])


def test_empty_non_contiguous_shared_and_0d_tensors_keep_dtype_shape_and_values(tmp_path):
    base = torch.arange(12, dtype=torch.float64)
    state = {
        "empty": torch.empty(0, 3),
        "empty_int": torch.zeros(0, dtype=torch.int64),
        "transposed": torch.randn(3, 4).t(),
        "slice": base[2:5],
        "whole": base,
        "again": base,
        "step": torch.tensor(4.0),
        "bf16": torch.randn(3, dtype=torch.bfloat16),
        "flags": torch.tensor([True, False]),
        "rng": torch.get_rng_state(),
    }
    save_state(state, tmp_path / "t")
    back = load_state(tmp_path / "t")
    _assert_same(state, back)


@pytest.mark.parametrize(
    "state, where",
    [
        ({"optimizer": {"param_groups": [{"lr": 1e-3, "fn": object()}]}}, "optimizer/param_groups/0/fn"),
        ({"a": {1, 2}}, "a"),
        ({"a": [torch.nn.Linear(1, 1)]}, "a/0"),
        ({"a": {2.5: 1}}, "a"),
    ],
)
def test_an_object_json_cannot_hold_is_a_type_error_naming_its_path(tmp_path, state, where):
    with pytest.raises(TypeError, match=rf"state at '{where}'"):
        save_state(state, tmp_path / "bad")


def test_a_damaged_file_is_an_error_naming_it(tmp_path):
    save_state({"w": torch.randn(64)}, tmp_path / "s")
    f = tmp_path / "s.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(
        StateFileError, match=r"s\.safetensors: not a readable safetensors file .*damaged or incomplete"
    ):
        load_state(tmp_path / "s")
    save_state({"w": torch.randn(64)}, tmp_path / "j")
    (tmp_path / "j.json").write_text('{"format": 1, "state": {"w": {"__tensor__": "v"}}}')
    with pytest.raises(StateFileError, match=r"j\.json names the tensor 'v'"):
        load_state(tmp_path / "j")


def test_an_older_pt_file_is_refused_unless_allowed_and_then_read(tmp_path):
    from armor_core.errors import UserFacingError, one_line

    _, opt, _ = _adamw_after_steps()
    torch.save({"optimizer": opt.state_dict()}, tmp_path / "critic_state.pt")
    for missing_ok in (False, True):  # a present .pt is never mistaken for an absent state
        with pytest.raises(StateFileError) as e:
            load_checkpoint_state(tmp_path / "critic_state", missing_ok=missing_ok)
        assert isinstance(e.value, UserFacingError)  # the CLI prints it as one line, exit code 2
        assert one_line(e.value) == (
            f"error: {tmp_path / 'critic_state.pt'} is a torch .pt state from an older ARMOR checkpoint, which is not "
            "unpickled by default; to resume from it, pass trainer.allow_legacy_pt_state=true"
        )
    got = load_checkpoint_state(tmp_path / "critic_state", allow_legacy_pt=True)
    _assert_same({"optimizer": opt.state_dict()}, got)
    save_state({"optimizer": {"new": 1}}, tmp_path / "critic_state")  # both there: the new files win
    assert load_checkpoint_state(tmp_path / "critic_state") == {"optimizer": {"new": 1}}
    assert load_checkpoint_state(tmp_path / "actor_rng_rank3", missing_ok=True, allow_legacy_pt=True) is None
    with pytest.raises(FileNotFoundError, match=r"actor_state\.safetensors is missing; the checkpoint is incomplete"):
        load_checkpoint_state(tmp_path / "actor_state", allow_legacy_pt=True)


def test_the_checkpoint_manifest_covers_both_files(tmp_path):
    from armor_core.storage.checkpoint import MANIFEST, CheckpointManager

    ck = CheckpointManager(tmp_path)
    path = ck.save(1, lambda d: save_state({"x": torch.ones(2)}, d / "actor_state"), {"step": 1})
    assert {"actor_state.safetensors", "actor_state.json"} <= set(json.loads((path / MANIFEST).read_text())["files"])


# -- an actor worker checkpoint (in this process, no Ray) ------------------------------------------


_OVERRIDES = [
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=1",
    "rollout.max_new_tokens=3",
    "data.max_prompt_length=4",
    "actor.lr=1e-3",
    "engine.cpus_per_worker=1",
    "trainer.loggers=[]",
    "actor.skip_zero_advantage=false",
]


def _actor(*overrides):
    from armor_core.config.schema import load_config, to_dict
    from armor_core.workers.actor.worker import ActorWorker

    return ActorWorker(to_dict(load_config(None, [*_OVERRIDES, *overrides])), rank=0, world_size=1)


def _critic(*overrides):
    from armor_core.config.schema import load_config, to_dict
    from armor_core.workers.critic.worker import CriticWorker

    cfg = load_config(None, [*_OVERRIDES, "algorithm.adv_estimator=gae", *overrides])
    return CriticWorker(to_dict(cfg), rank=0, world_size=1)


_LEGACY = "trainer.allow_legacy_pt_state=true"


def _batch():
    from armor_core.dataproto.protocol import DataProto
    from armor_core.testing.batches import rollout_batch

    ids, attn, pos, responses = rollout_batch([4, 3, 2, 4], [3, 2, 3, 1], P=4, R=3, vocab=19)
    mask = attn[:, 4:].clone()
    g = torch.Generator().manual_seed(1)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": responses,
            "response_mask": mask,
            "advantages": torch.randn(4, 3, generator=g) * mask,
            "values": torch.randn(4, 3, generator=g) * mask,
            "returns": torch.randn(4, 3, generator=g) * mask,
        }
    )


def _to_old_pt_files(ckpt, *stems):
    """Rewrite states as a checkpoint written before safetensors + JSON held them: torch.save files."""
    for stem in stems:
        torch.save(load_state(ckpt / stem), ckpt / f"{stem}.pt")
        for ext in (".safetensors", ".json"):
            (ckpt / f"{stem}{ext}").unlink()


def _assert_resumed(saved, resumed, rng):
    _assert_same(saved.optimizer.state_dict(), resumed.optimizer.state_dict(), "optimizer")
    assert resumed.scheduler.state_dict() == saved.scheduler.state_dict() and resumed.global_step == saved.global_step
    assert torch.equal(torch.get_rng_state(), rng)


def test_an_actor_checkpoint_holds_no_pickle_and_resumes_from_it_or_from_allowed_older_pt_files(tmp_path):
    w = _actor()
    w.update_actor(_batch(), step=1)
    assert w.optimizer.state and w.global_step > 0
    torch.rand(7)  # the generator moves on from where a new worker's seed puts it
    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    w.save_checkpoint(str(ckpt))
    rng = torch.get_rng_state()
    assert {"actor_state.safetensors", "actor_state.json", "actor_rng_rank0.safetensors", "actor_rng_rank0.json"} <= {
        p.name for p in ckpt.iterdir()
    }
    assert not list(ckpt.glob("*.pt"))
    resumed = _actor()
    assert not torch.equal(torch.get_rng_state(), rng)
    resumed.load_checkpoint(str(ckpt))
    _assert_resumed(w, resumed, rng)
    _to_old_pt_files(ckpt, "actor_state", "actor_rng_rank0")
    with pytest.raises(StateFileError, match=r"actor_state\.pt is a torch \.pt state .*trainer.allow_legacy_pt_state"):
        _actor().load_checkpoint(str(ckpt))
    old = _actor(_LEGACY)
    old.load_checkpoint(str(ckpt))
    _assert_resumed(w, old, rng)


def test_a_critic_checkpoint_resumes_from_safetensors_and_from_an_allowed_older_pt_file(tmp_path):
    c = _critic()
    c.update_critic(_batch(), step=1)
    assert c.optimizer.state
    c.save_checkpoint(str(tmp_path))
    assert {"critic_state.safetensors", "critic_state.json"} <= {p.name for p in tmp_path.iterdir()} and not list(
        tmp_path.glob("*.pt")
    )
    resumed = _critic()
    resumed.load_checkpoint(str(tmp_path))
    _assert_same(c.optimizer.state_dict(), resumed.optimizer.state_dict(), "optimizer")
    _to_old_pt_files(tmp_path, "critic_state")
    with pytest.raises(StateFileError, match=r"critic_state\.pt is a torch \.pt state"):
        _critic().load_checkpoint(str(tmp_path))
    old = _critic(_LEGACY)
    old.load_checkpoint(str(tmp_path))
    _assert_same(c.optimizer.state_dict(), old.optimizer.state_dict(), "optimizer")
