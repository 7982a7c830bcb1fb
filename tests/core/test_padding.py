"""Padding removal in the actor's forward (``armor_core.workers.common.pack_rows``) and the step
timing that makes the engine's overhead visible.

Packing must be exact: the same log-probs, entropies and gradients as the padded batch, to float
rounding, for left-padded prompts and right-padded responses of mixed lengths.
"""

from __future__ import annotations

import pytest
import torch

from armor_core.models import build_tiny_model
from armor_core.workers.common import forward_response_log_probs, forward_response_logits, pack_rows, response_log_probs

PAD = 0


def _batch(prompt_lens, resp_lens, P=6, R=5, vocab=23, seed=0):
    """Left-padded prompts + right-padded responses, laid out like the rollout's output."""
    g = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    ids = torch.randint(3, vocab, (bs, P + R), generator=g)
    attn = torch.zeros(bs, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        attn[i, P - p : P] = 1
        attn[i, P : P + r] = 1
    ids = torch.where(attn.bool(), ids, torch.full_like(ids, PAD))
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    # positions after a short response keep counting, as the rollout writes them
    pos[:, P:] = pos[:, P - 1 : P] + torch.arange(1, R + 1)
    return ids, attn, pos, ids[:, P:].clone()


def _model(arch: str = "qwen2"):
    return build_tiny_model(arch, 23, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


CASES = {
    "mixed": ([6, 3, 1, 5, 2, 6, 4], [5, 1, 3, 0, 5, 2, 4]),
    "equal_prompts": ([6] * 8, [3, 4, 3, 4, 5, 3, 1, 4]),
    "single_row": ([2], [3]),
}


@pytest.mark.parametrize("case,arch", [(c, "qwen2") for c in sorted(CASES)] + [("mixed", "qwen3"), ("mixed", "deepseek_v3")])
def test_packed_log_probs_entropy_and_gradients_equal_padded(case, arch):
    model = _model(arch)
    ids, attn, pos, resp = _batch(*CASES[case])
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()  # attended and predicted from an attended token
    weights = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1))

    def run(pack: bool):
        model.zero_grad()
        lp, ent, (computed, real) = forward_response_log_probs(model, ids, attn, pos, resp, 0.7, True, pack=pack)
        ((lp * weights * valid).sum() + (ent * valid).sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()], computed, real

    lp0, ent0, g0, computed0, real0 = run(False)
    lp1, ent1, g1, computed1, real1 = run(True)
    assert torch.allclose(lp1[valid], lp0[valid], atol=1e-5), (lp1 - lp0)[valid].abs().max()
    assert torch.allclose(ent1[valid], ent0[valid], atol=1e-5)
    assert torch.equal(lp1[~valid], torch.zeros_like(lp1[~valid]))  # not computed: 0, never garbage
    for a, b in zip(g0, g1):  # equal up to float32 rounding of differently shaped matmuls
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()
    assert real0 == real1 == int(attn.sum())
    assert computed0 == attn.numel() and computed1 < computed0


def test_packed_log_probs_match_the_plain_padded_functions(model):
    """forward_response_log_probs(pack=False) is exactly the old path: logits slice + response_log_probs."""
    ids, attn, pos, resp = _batch(*CASES["mixed"])
    with torch.no_grad():
        lp_ref, _ = response_log_probs(forward_response_logits(model, ids, attn, pos, resp.shape[1]), resp, 1.0, False)
        lp, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False, pack=False)
    assert torch.equal(lp, lp_ref)


def test_pack_layout_places_every_real_token_once_with_restarting_positions():
    lens = [(7, r) for r in (3, 4, 3, 4, 4, 3, 8, 1)] * 8
    ids, attn, pos, resp = _batch([p for p, _ in lens], [r for _, r in lens], P=7, R=8)
    packed = pack_rows(ids, attn, pos, 8, capacity=64)
    assert packed.real_tokens == int(attn.sum())
    real_ids = packed.input_ids[packed.position_ids.ne(0) | packed.input_ids.ne(PAD)]
    assert sorted(real_ids.tolist()) == sorted(ids[attn.bool()].tolist())
    # every sequence starts at position 0 and counts up by one
    starts = (packed.position_ids == 0) & packed.input_ids.ne(PAD)
    assert int(starts.sum()) == len(lens)
    # these lengths mimic the default run (7-token prompts, mostly 3-4 token answers): <= 10% waste
    assert (packed.computed - packed.real_tokens) / packed.real_tokens <= 0.10
    assert len(packed.predict_index) == len(packed.response_index) == int((attn[:, -8:] * attn[:, -9:-1]).sum())


def test_rows_with_gapped_positions_fall_back_to_padded_forward(model):
    ids, attn, pos, resp = _batch(*CASES["mixed"])
    pos = pos.clone()
    pos[0, -2:] += 5  # a jump inside one row: packed, transformers would read it as a new sequence
    assert pack_rows(ids, attn, pos, resp.shape[1], 64) is None
    with torch.no_grad():
        lp, _, (computed, _) = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False, pack=True)
        lp0, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False, pack=False)
    assert computed == attn.numel() and torch.equal(lp, lp0)


def test_timer_splits_worker_time_from_overhead_and_adds_up():
    import time

    from armor_core.trainer import _Timer, _worker_seconds

    timer = _Timer()
    with timer("gen") as stage:
        time.sleep(0.02)
        stage.worker_s = _worker_seconds([0.005, 0.01])  # the slowest rank's time counts
    with timer("reward"):
        time.sleep(0.005)
    t = timer.t
    assert t["timing_s/gen"] == pytest.approx(0.01)
    assert t["timing_s/overhead"] >= 0.009
    assert t["timing_s/gen"] + t["timing_s/overhead"] >= 0.02
    assert "timing_s/overhead" not in _Timer().t and _worker_seconds(None) is None


def test_actor_update_is_the_same_packed_and_reports_padding_waste(tmp_path):
    """ActorWorker in this process (no Ray): one update on packed rows has the gradient of the same
    update on padded rows, and the metrics say how much padding the training forward computed."""
    from armor_core.config import load_config, to_dict
    from armor_core.trainer import prepare_data
    from armor_core.protocol import DataProto
    from armor_core.workers.actor import ActorWorker

    cfg = load_config(None, ["data.train_size=64", "data.val_size=8", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                             "rollout.n=4", "actor.micro_batch_size=16", f"trainer.run_dir={tmp_path}"])
    train, _ = prepare_data(cfg)
    prompts = DataProto.from_dict(tensors=dict(train.encoded["tensors"]))[:8].repeat(4, interleave=True)
    results = {}
    for pack in (False, True):
        worker = ActorWorker(to_dict(cfg))
        torch.manual_seed(0)
        batch = worker.generate(prompts)
        batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0)) * batch["response_mask"]
        worker.pack = pack
        metrics = worker.update_actor(batch, 1)
        # one mini-batch: the gradients left in .grad are the ones the optimizer stepped with
        results[pack] = (metrics, [p.grad.clone() for p in worker.model.parameters()])
    (m_pad, g_pad), (m_pack, g_pack) = results[False], results[True]
    assert m_pack["actor/pg_loss"] == pytest.approx(m_pad["actor/pg_loss"], abs=1e-6)
    for a, b in zip(g_pad, g_pack):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max()))
    assert m_pack["perf/padding_waste"] <= 0.10 < m_pad["perf/padding_waste"]
    assert 0 < m_pack["perf/actor_fwd_bwd_s"] + m_pack["perf/actor_optimizer_s"] <= m_pack["perf/worker_s"]
