"""Sharded checkpoints (``actor.checkpoint_format``, auto under FSDP2 on more than one rank): each rank writes its
own shards, nothing is gathered, and the checkpoint resumes exactly on the same world size, on fewer ranks and on
more, for the actor and the critic; ``armor export`` assembles a Hugging Face directory from the shards that
transformers loads to the trainer's logits.

One 2-process gloo group runs every case (``run_ranks``); rank 0 alone plays the one-rank side. Four ranks
write the checkpoint two then resume (4 -> 2) in groups of their own.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import pytest
import torch
from test_parallel import full_state, make_batch, make_config, shares

from armor_core.testing import run_ranks

pytestmark = pytest.mark.slow  # a process group of two ranks


def _state(w) -> dict:
    from armor_core.workers.parallel.strategy import full_optimizer_state

    # copied: on one rank the optimizer's state comes back as its own tensors, which the next step changes in place
    return copy.deepcopy({"params": full_state(w.model), "optim": full_optimizer_state(w.model, w.optimizer)})


def _flat(optim: dict) -> dict[str, torch.Tensor]:
    return {f"{p}.{k}": torch.as_tensor(v) for p, st in optim["state"].items() for k, v in st.items()}


def _cases(rank: int, world: int, out_dir: str) -> dict:
    import torch.distributed as dist

    from armor_core.workers.actor.worker import ActorWorker
    from armor_core.workers.critic.worker import CriticWorker

    batch = make_batch()
    mine = shares(batch, world)[rank]
    out: dict = {}
    cfg = make_config("token-mean", "fsdp2")
    two = os.path.join(out_dir, "two")
    # two ranks train a step and save (auto: sharded), then take a second step: the uninterrupted run
    w = ActorWorker(cfg, rank=rank, world_size=world)
    w.update_actor(mine, step=1)
    w.save_checkpoint(two)
    saved = _state(w)
    m = w.update_actor(mine, step=2)
    out["after"], out["after_loss"] = full_state(w.model), (m["actor/pg_loss"], m["actor/grad_norm"])
    dist.barrier()
    out["files"] = sorted(str(p.relative_to(two)) for p in Path(two).rglob("*") if p.is_file())
    # the same world size: every tensor back bit for bit, and the next step the one the uninterrupted run took
    w2 = ActorWorker(cfg, rank=rank, world_size=world)
    w2.load_checkpoint(two)
    out["same"] = (saved, _state(w2))
    w2.update_actor(mine, step=2)
    out["same_after"] = full_state(w2.model)
    # the critic, sharded too
    c = CriticWorker(cfg, rank=rank, world_size=world)
    c.update_critic(mine, step=1)
    critic_dir = os.path.join(out_dir, "critic")
    c.save_checkpoint(critic_dir)
    critic_saved = _state(c)
    dist.barrier()
    if rank == 0:  # one rank reads what two wrote, and takes the whole batch's step
        w1 = ActorWorker(cfg, rank=0, world_size=1)
        w1.load_checkpoint(two)
        out["fewer"] = (saved, _state(w1))
        m = w1.update_actor(batch, step=2)
        out["fewer_after"] = (m["actor/pg_loss"], m["actor/grad_norm"])
        c1 = CriticWorker(cfg, rank=0, world_size=1)
        c1.load_checkpoint(critic_dir)
        out["critic"] = (critic_saved, _state(c1))
        # one rank writes the sharded form on request; two ranks will read it
        one = ActorWorker(make_config("token-mean", "fsdp2", **{"actor.checkpoint_format": "sharded"}), 0, 1)
        one.update_actor(batch, step=1)
        one.save_checkpoint(os.path.join(out_dir, "one"))
        out["one_saved"] = _state(one)
        from armor_core.cli.export import export

        export(Path(two), Path(out_dir) / "exported", merge=False)
        out["exported_from"] = saved["params"]
    dist.barrier()
    w3 = ActorWorker(cfg, rank=rank, world_size=world)
    w3.load_checkpoint(os.path.join(out_dir, "one"))
    out["more"] = _state(w3)
    # in the background (trainer.async_save): the shards are copied before the call returns, so the next step may
    # change every tensor at once; what is written is the state at the save
    background = os.path.join(out_dir, "background")
    w4 = ActorWorker(cfg, rank=rank, world_size=world)
    w4.update_actor(mine, step=1)
    w4.save_checkpoint(background, background=True)
    at_save = _state(w4)
    w4.update_actor(mine, step=2)
    w4.wait_saved()
    w5 = ActorWorker(cfg, rank=rank, world_size=world)
    w5.load_checkpoint(background)
    out["background"] = (at_save, _state(w5))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    return run_ranks(functools.partial(_cases, out_dir=str(out)), 2, out), out


def test_each_rank_writes_its_own_shards_and_no_full_model(results):
    files = results[0][0]["files"]
    assert {"actor_shards/.metadata", "actor_shards/__0_0.distcp", "actor_shards/__1_0.distcp"} <= set(files)
    assert "model_config/config.json" in files and "model_config/tokenizer.json" in files
    assert not any(f.startswith("model/") for f in files)  # nothing gathered into a full model directory


def _same(pair, what: str) -> None:
    """Every parameter and optimizer tensor loaded equals the one saved, bit for bit (reading slices back
    reassembles the very numbers written, whatever layout reads them)."""
    saved, loaded = pair
    assert loaded["params"].keys() == saved["params"].keys(), what
    for k, v in saved["params"].items():
        assert torch.equal(loaded["params"][k], v), f"{what}: {k}"
    want, got = _flat(saved["optim"]), _flat(loaded["optim"])
    assert any(k.endswith("exp_avg_sq") for k in want) and got.keys() == want.keys(), what
    for k, v in want.items():
        assert torch.equal(got[k], v), f"{what}: optimizer {k}"


def test_a_sharded_checkpoint_resumes_bit_for_bit_on_the_same_ranks(results):
    for rank in range(2):
        _same(results[0][rank]["same"], f"2 -> 2, rank {rank}")
        after, again = results[0][rank]["after"], results[0][rank]["same_after"]
        assert all(torch.equal(again[k], after[k]) for k in after)  # the next step, exactly the one not interrupted


def test_a_sharded_checkpoint_resumes_on_fewer_and_on_more_ranks(results):
    r0 = results[0][0]
    _same(r0["fewer"], "2 -> 1")
    # the next step's loss and gradient norm, one rank on the whole batch against two on their shares
    assert r0["fewer_after"] == pytest.approx(r0["after_loss"], rel=1e-5)
    for rank in range(2):
        _same((r0["one_saved"], results[0][rank]["more"]), f"1 -> 2, rank {rank}")


def test_the_critics_shards_resume_on_one_rank(results):
    _same(results[0][0]["critic"], "critic 2 -> 1")


def test_export_assembles_a_model_that_transformers_loads_to_the_trainers_weights(results):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(results[1] / "exported")
    want = results[0][0]["exported_from"]
    got = model.state_dict()
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    ids = torch.tensor([[5, 6, 7, 8]])
    from armor_core.models.loading import load_tokenizer

    assert load_tokenizer(str(results[1] / "exported")) is not None
    assert torch.isfinite(model(ids).logits).all()


def _four(rank: int, world: int, out_dir: str) -> dict:
    """Four ranks train a step, save (sharded) and take the next step: the uninterrupted run's loss."""
    from armor_core.workers.actor.worker import ActorWorker

    batch = make_batch()
    w = ActorWorker(make_config("token-mean", "fsdp2"), rank=rank, world_size=world)
    w.update_actor(shares(batch, world)[rank], step=1)
    w.save_checkpoint(os.path.join(out_dir, "four"))
    saved = _state(w)
    m = w.update_actor(shares(batch, world)[rank], step=2)
    return {"saved": saved, "after_loss": (m["actor/pg_loss"], m["actor/grad_norm"])}


def _two_of_four(rank: int, world: int, out_dir: str) -> dict:
    """Two ranks resume what four wrote and take the same global batch's next step."""
    from armor_core.workers.actor.worker import ActorWorker

    batch = make_batch()
    w = ActorWorker(make_config("token-mean", "fsdp2"), rank=rank, world_size=world)
    w.load_checkpoint(os.path.join(out_dir, "four"))
    loaded = _state(w)
    m = w.update_actor(shares(batch, world)[rank], step=2)
    return {"loaded": loaded, "after_loss": (m["actor/pg_loss"], m["actor/grad_norm"])}


def test_a_checkpoint_of_four_ranks_resumes_on_two(tmp_path):
    (tmp_path / "r4").mkdir()
    (tmp_path / "r2").mkdir()
    four = run_ranks(functools.partial(_four, out_dir=str(tmp_path)), 4, tmp_path / "r4")
    two = run_ranks(functools.partial(_two_of_four, out_dir=str(tmp_path)), 2, tmp_path / "r2")
    assert len(list((tmp_path / "four" / "actor_shards").glob("*.distcp"))) == 4
    for rank in range(2):
        _same((four[0]["saved"], two[rank]["loaded"]), f"4 -> 2, rank {rank}")
        assert two[rank]["after_loss"] == pytest.approx(four[0]["after_loss"], rel=1e-5)


def test_shards_written_in_the_background_hold_the_state_at_the_save(results):
    for rank in range(2):
        _same(results[0][rank]["background"], f"background save, rank {rank}")
