"""Under FSDP2 the hf rollout generates from the sharded policy itself (``actor.fsdp_generation=shards``): no rank
keeps a full copy, and what it samples is what the full copy samples (``copy``), greedy and seeded, with ranks that
hold different numbers of prompts (stand-in micro-batches) and finish at different steps (a finished rank decodes
on in step); after an update the shards are the policy, with no sync. A checkpoint in the full form is gathered
from the shards.

One 2-process gloo group (``run_ranks``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from test_parallel import full_state, make_batch, make_config, shares

pytestmark = pytest.mark.slow  # a process group of two ranks

# rank 0: three prompts (two micro-batches of 2), rank 1: one (a stand-in keeps it in step for the second)
PROMPTS = {0: ["12+7=", "3+4=", "40+41="], 1: ["9+9="]}


def _prompts(tok, rank: int):
    from armor_core.dataproto.protocol import DataProto
    from armor_core.models.loading import encode_prompts

    ids, mask, pos, _ = encode_prompts(tok, PROMPTS[rank], max_length=8)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def _cases(rank: int, world: int, out_dir: str) -> dict:
    from safetensors.torch import load_file

    from armor_core.workers.actor.worker import ActorWorker

    extra = {"rollout.micro_batch_size": "2", "rollout.max_new_tokens": "6"}
    shards = ActorWorker(make_config("token-mean", "fsdp2", **extra), rank=rank, world_size=world)
    copy = ActorWorker(make_config("token-mean", "fsdp2", **extra, **{"actor.fsdp_generation": "copy"}), rank, world)
    out: dict = {"no_copy": shards.gen_model is shards.model, "copy_kept": copy.gen_model is not copy.model}
    prompts = _prompts(shards.tokenizer, rank)

    def both(greedy: bool) -> tuple:
        """Each worker seeded alike, then two calls: the second shows the first drew as many random numbers
        (stand-ins and a finished rank's extra steps draw none)."""
        outs = []
        for w in (shards, copy):
            torch.manual_seed(100 + rank)
            w.generate(prompts, greedy=greedy)
            o = w.generate(prompts, greedy=greedy)
            outs.append({k: o[k] for k in ("responses", "response_mask", "rollout_log_probs")})
        return tuple(outs)

    out["greedy"], out["sampled"] = both(True), both(False)
    mine = shares(make_batch(), world)[rank]
    shards.update_actor(mine, step=1)
    out["checked"] = sorted(shards.logp.checked), shards.logp.layouts, shards.logp.padding_metrics()
    copy.update_actor(mine, step=1)
    synced = copy.sync_weights()  # the copy is refreshed, a bucket at a time; the shards are the policy already
    out["sync_metrics"] = sorted(synced)
    out["after_update"] = both(False)
    out["copy_is_policy"] = _equal(copy.gen_model.state_dict(), full_state(copy.model))

    from armor_core.models.state_buckets import full_state_buckets

    whole, limit = full_state(shards.model), 1 << 14
    sizes, got = [], {}
    for bucket in full_state_buckets(shards.model, limit):  # every rank gathers each tensor in the same order
        nbytes = [t.numel() * t.element_size() for t in bucket.values()]
        sizes.append((len(bucket), sum(nbytes)))
        got.update({k: v.clone() for k, v in bucket.items()})
    out["buckets"] = sizes, limit, sorted(got), sorted(whole), _equal(got, whole)
    out["tied"] = bool(shards.model.config.tie_word_embeddings)

    shards.cfg.actor.checkpoint_format = "full"
    shards.save_checkpoint(out_dir)  # gathered from the shards: rank 0 writes model/ without a copy
    state = full_state(shards.model)
    if rank == 0:
        saved = load_file(str(Path(out_dir) / "model" / "model.safetensors"))
        out["full_saved"] = all(torch.equal(saved[k], v) for k, v in state.items() if k in saved)
        out["full_keys"] = set(saved) >= {k for k in state if k != "lm_head.weight"}
    return out


def _equal(some: dict, whole: dict) -> bool:
    return all(torch.equal(v, whole[k]) for k, v in some.items())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from armor_core.testing import run_ranks

    out = tmp_path_factory.mktemp("gen_shards")
    return run_ranks(functools.partial(_cases, out_dir=str(out)), 2, out)


def test_no_rank_keeps_a_full_copy_unless_asked(results):
    assert all(r["no_copy"] and r["copy_kept"] for r in results)


@pytest.mark.parametrize("case", ["greedy", "sampled", "after_update"])
def test_the_shards_sample_what_the_full_copy_samples(results, case):
    for rank, r in enumerate(results):
        got, want = r[case]
        assert torch.equal(got["responses"], want["responses"]), (case, rank)
        assert torch.equal(got["response_mask"], want["response_mask"]), (case, rank)
        torch.testing.assert_close(got["rollout_log_probs"], want["rollout_log_probs"], rtol=1e-5, atol=1e-6)
    assert len(results[0]["greedy"][0]["responses"]) == 3 and len(results[1]["greedy"][0]["responses"]) == 1


def test_a_full_checkpoint_is_gathered_from_the_shards(results):
    assert results[0]["full_saved"] and results[0]["full_keys"]


def test_a_sync_sends_the_policy_a_bucket_at_a_time_gathered_from_the_shards(results):
    """Each bucket holds whole tensors up to the limit (one larger tensor alone), all of them together are the
    policy (a tied head once, under the embedding's name: tests/core/workers/test_shards_tied.py); the copy synced
    this way is the policy."""
    for r in results:
        sizes, limit, names, whole, equal = r["buckets"]
        assert len(sizes) > 3 and all(nbytes <= limit or n == 1 for n, nbytes in sizes), sizes
        assert equal and names == sorted(set(whole) - ({"lm_head.weight"} if r["tied"] else set()))
        assert r["copy_is_policy"] and "perf/sync_gb_per_s" in r["sync_metrics"]


def test_the_shards_check_layouts_together_and_pack(results):
    """Without a copy to check a layout on alone, the ranks check each one together: every rank keeps the same
    layouts, and the update's passes run packed, not padded."""
    (checked, layouts, metrics), (checked_1, layouts_1, _) = (r["checked"] for r in results)
    assert checked == checked_1 and layouts == layouts_1 and "packed" in checked
    assert metrics["perf/padding_waste"] < 0.5, metrics
