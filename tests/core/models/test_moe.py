"""Router metrics of an MoE model: what the experts received in a forward."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.models.loading import build_tiny_model
from armor_core.models.moe import RouterWatch, is_moe, routers


@pytest.fixture(scope="module")
def moe():
    return build_tiny_model("deepseek_v3", 23, hidden_size=64, num_layers=3, num_heads=2, seed=0).eval()


def test_every_token_is_counted_once_per_expert_it_was_routed_to(moe):
    watch = RouterWatch(moe)
    assert is_moe(moe) and len(watch.routers) == 2  # layer 0 is dense (first_k_dense_replace=1)
    ids = torch.randint(1, 23, (3, 7), generator=torch.Generator().manual_seed(0))
    with watch.watch():
        moe(input_ids=ids)
    counts = list(watch.counts.values())
    assert [float(c.sum()) for c in counts] == [3 * 7 * 2] * 2  # tokens x top-2, in each MoE layer
    m = watch.metrics()
    shares = [c / c.sum() for c in counts]
    assert m["moe/load_max"] == pytest.approx(sum(float(s.max()) * 4 for s in shares) / 2)
    assert 1 <= m["moe/load_max"] <= 4 and 0 <= m["moe/load_min"] <= 1
    entropy = [float(-(s[s > 0] * s[s > 0].log()).sum()) / math.log(4) for s in shares]
    assert m["moe/load_entropy"] == pytest.approx(sum(entropy) / 2)
    assert watch.metrics() == {}, "the counts start again after each read"
    moe(input_ids=ids)  # outside watch(): nothing is counted, no hook is left behind
    assert watch.counts == {} and all(not r._forward_hooks for r in watch.routers)


def test_a_router_that_sends_everything_to_one_expert_reads_as_collapse(moe):
    watch = RouterWatch(moe)
    saved = [(r.weight.detach().clone(), r.e_score_correction_bias.detach().clone()) for r in watch.routers]
    try:
        with torch.no_grad():
            for r in watch.routers:  # expert 0 and 1 always win: top-2 of 4, two never used
                r.e_score_correction_bias.copy_(torch.tensor([10.0, 9.0, 0.0, 0.0]))
        with watch.watch():
            moe(input_ids=torch.randint(1, 23, (2, 9), generator=torch.Generator().manual_seed(1)))
        m = watch.metrics()
    finally:
        with torch.no_grad():
            for r, (w, b) in zip(watch.routers, saved):
                r.weight.copy_(w)
                r.e_score_correction_bias.copy_(b)
    assert m["moe/load_max"] == pytest.approx(2.0) and m["moe/load_min"] == 0.0
    assert m["moe/experts_unused"] == 0.5 and m["moe/load_entropy"] == pytest.approx(math.log(2) / math.log(4))


def test_a_dense_model_has_no_router_and_no_metrics():
    dense = build_tiny_model("qwen2", 23, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    watch = RouterWatch(dense)
    assert routers(dense) == [] and not is_moe(dense)
    with watch.watch():
        dense(input_ids=torch.ones(1, 3, dtype=torch.long))
    assert watch.metrics() == {}


def test_a_lora_policy_on_an_moe_model_trains_and_reports_its_routing(tmp_path):
    """LoRA on DeepSeek-V3's shapes (multi-head latent attention, routed experts): one update moves the adapters and
    only them, and the update's metrics carry the experts' load."""
    from armor_core.config.schema import load_config, to_dict
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.data import prepare_data
    from armor_core.models.loading import load_tokenizer
    from armor_core.workers.actor.worker import ActorWorker

    tok = load_tokenizer("builtin:arithmetic-tiny")
    model = build_tiny_model("deepseek_v3", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path / 'moe'}",
            "model.lora_rank=4",
            "data.train_size=64",
            "data.val_size=8",
            "data.train_batch_size=8",
            "actor.ppo_mini_batch_size=8",
            "rollout.n=4",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    train, _ = prepare_data(cfg)
    worker = ActorWorker(to_dict(cfg))
    torch.manual_seed(0)
    batch = worker.generate(DataProto.from_dict(tensors=dict(train.encoded["tensors"]))[:8].repeat(4, interleave=True))
    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    batch["advantages"] *= batch["response_mask"]
    params = dict(worker.model.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    metrics = worker.update_actor(batch, 1)
    changed = {k for k, v in params.items() if not torch.equal(before[k], v.detach())}
    assert changed and all("lora_" in k for k in changed), sorted(changed)[:5]
    assert any(".experts." in k for k in changed) and any("q_a_proj" in k for k in changed)
    assert 1 <= metrics["moe/load_max"] <= 4 and 0 < metrics["moe/load_entropy"] <= 1
