"""Padding removal in the actor's forward (``armor_core.workers.forward.packing.pack_rows``) and the step
timing that makes the engine's overhead visible.

Packing must be exact: the same log-probs, entropies and gradients as the padded batch, to float
rounding, for left-padded prompts and right-padded responses of mixed lengths.
"""

from __future__ import annotations

import pytest
import torch

from armor_core.models.loading import build_tiny_model
from armor_core.testing import rollout_batch as _batch
from armor_core.testing import shared_prompt_batch as _grouped_batch
from armor_core.workers.forward.layouts import (
    forward_response_log_probs,
    forward_response_logits,
    layout_rows,
    response_log_probs,
)
from armor_core.workers.forward.packing import pack_groups, pack_rows

PAD = 0  # rollout_batch's pad id


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


@pytest.mark.parametrize(
    "case,arch", [(c, "qwen2") for c in sorted(CASES)] + [("mixed", "qwen3"), ("mixed", "deepseek_v3")]
)
def test_packed_log_probs_entropy_and_gradients_equal_padded(case, arch):
    model = _model(arch)
    ids, attn, pos, resp = _batch(*CASES[case])
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()  # attended and predicted from an attended token
    weights = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1))

    def run(layouts):
        model.zero_grad()
        lp, ent, stats = forward_response_log_probs(
            model, ids, attn, pos, resp, 0.7, True, layout_rows(ids, attn, pos, R, layouts)
        )
        ((lp * weights * valid).sum() + (ent * valid).sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()], stats.computed, stats.needed

    lp0, ent0, g0, computed0, real0 = run(())
    lp1, ent1, g1, computed1, real1 = run(("packed",))
    assert torch.allclose(lp1[valid], lp0[valid], atol=1e-5), (lp1 - lp0)[valid].abs().max()
    assert torch.allclose(ent1[valid], ent0[valid], atol=1e-5)
    assert torch.equal(lp1[~valid], torch.zeros_like(lp1[~valid]))  # not computed: 0, never garbage
    for a, b in zip(g0, g1):  # equal up to float32 rounding of differently shaped matmuls
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()
    assert real0 == real1 == int(attn.sum())
    assert computed0 == attn.numel() and computed1 < computed0


def test_packed_log_probs_match_the_plain_padded_functions(model):
    """forward_response_log_probs without a layout is exactly the old path: logits slice + response_log_probs."""
    ids, attn, pos, resp = _batch(*CASES["mixed"])
    with torch.no_grad():
        lp_ref, _ = response_log_probs(forward_response_logits(model, ids, attn, pos, resp.shape[1]), resp, 1.0, False)
        lp, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False)
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
        lp, _, stats = forward_response_log_probs(
            model, ids, attn, pos, resp, 1.0, False, layout_rows(ids, attn, pos, resp.shape[1])
        )
        lp0, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False)
    assert stats.kind == "padded" and stats.computed == attn.numel() and torch.equal(lp, lp0)
    assert pack_groups(ids, attn, pos, resp.shape[1]) is None


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "deepseek_v3"])
def test_grouped_log_probs_entropy_and_gradients_equal_padded(arch):
    """Rows that share a prompt, laid out as one segment (the prompt once, then every response):
    the same log-probs, entropies and gradients as the padded batch, with fewer positions."""
    model = _model(arch)
    ids, attn, pos, resp = _grouped_batch()
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()
    weights = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1))

    def run(layouts):
        model.zero_grad()
        lp, ent, stats = forward_response_log_probs(
            model, ids, attn, pos, resp, 0.7, True, layout_rows(ids, attn, pos, R, layouts)
        )
        ((lp * weights * valid).sum() + (ent * valid).sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()], stats

    lp0, ent0, g0, padded = run(())
    lp1, ent1, g1, grouped = run(("grouped",))
    _, _, _, packed = run(("packed",))
    assert grouped.kind == "grouped" and packed.kind == "packed"
    assert torch.allclose(lp1[valid], lp0[valid], atol=1e-5), (lp1 - lp0)[valid].abs().max()
    assert torch.allclose(ent1[valid], ent0[valid], atol=1e-5)
    assert torch.equal(lp1[~valid], torch.zeros_like(lp1[~valid]))
    for a, b in zip(g0, g1):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()
    # each of the four prompts is computed once instead of once per row
    prompts = {tuple(row[m.bool()].tolist()) for row, m in zip(ids[:, :6], attn[:, :6])}
    saved = int(attn[:, :6].sum()) - sum(len(p) for p in prompts)
    assert grouped.batch == padded.batch == int(attn.sum())
    assert grouped.needed == int(attn.sum()) - saved and saved > 0
    assert grouped.computed < packed.computed < padded.computed


def test_grouped_layout_masks_other_responses_and_places_each_prompt_once():
    ids, attn, pos, resp = _grouped_batch()
    R = resp.shape[1]
    g = pack_groups(ids, attn, pos, R)
    assert g.attention_mask.shape == (g.input_ids.shape[0], 1, g.input_ids.shape[1], g.input_ids.shape[1])
    mask = g.attention_mask[:, 0]
    assert bool(mask.diagonal(dim1=1, dim2=2).all())  # every position, pads too, sees itself: no all-masked row
    # a token never sees a later position, nor a token of another segment
    pos_q, pos_k = g.position_ids[:, :, None], g.position_ids[:, None, :]
    assert not bool((mask & (pos_k > pos_q)).any())
    assert len(g.predict_index) == len(g.response_index) == int(valid_count(attn, R))
    # a response token of one row must not see another row's response: same position in a segment
    # with the same prompt can only be another row's response token
    same_pos = (pos_q == pos_k) & ~torch.eye(g.input_ids.shape[1], dtype=torch.bool)
    assert not bool((mask & same_pos).any())
    # distinct prompts, none shared: no grouped layout; a segment over max_segment: none either
    distinct_ids, a2, p2, r2 = _batch(*CASES["mixed"])
    assert pack_groups(distinct_ids, a2, p2, r2.shape[1]) is None
    assert pack_groups(ids, attn, pos, R, max_segment=8) is None
    assert layout_rows(ids, attn, pos, R).kind == "grouped"
    assert layout_rows(ids, attn, pos, R, layouts=("packed",)).kind == "packed"
    cheap, dear = (
        pack_groups(ids, attn, pos, R, attention_weight=0.0),
        pack_groups(ids, attn, pos, R, attention_weight=0.1),
    )
    assert dear.input_ids.shape[1] < cheap.input_ids.shape[1]  # dearer attention: narrower rows
    # 2-token prompts shared by 8 responses of 20: a segment (162 tokens) is far wider than a packed
    # row of a few sequences (88), and saves only 14 tokens in 176. With attention of some cost, the
    # cost model refuses the grouped layout and packed rows are used
    ids, attn, pos, resp = _batch([2] * 16, [20] * 16, P=2, R=20)
    ids[:8, :2], ids[8:, :2] = ids[0, :2], ids[8, :2]
    assert pack_groups(ids, attn, pos, 20, attention_weight=0.0) is not None
    assert pack_groups(ids, attn, pos, 20, attention_weight=0.05) is None
    assert layout_rows(ids, attn, pos, 20, attention_weight=0.05).kind == "packed"


def valid_count(attn, R):
    return (attn[:, -R:] * attn[:, -R - 1 : -1]).sum()


def test_timer_splits_worker_time_from_overhead_and_adds_up():
    import time

    from armor_core.dataproto.metrics import merge_metrics
    from armor_core.loop.step_timer import StepTimer

    timer = StepTimer()
    with timer("gen") as stage:
        time.sleep(0.02)
        stage.worker_s = merge_metrics([{"perf/worker_s": 0.005}, {"perf/worker_s": 0.01}])[
            "perf/worker_s"
        ]  # the slowest rank's time counts
    with timer("reward"):
        time.sleep(0.005)
    t = timer.t
    assert t["timing_s/gen"] == pytest.approx(0.01)
    assert t["timing_s/overhead"] >= 0.009
    assert t["timing_s/gen"] + t["timing_s/overhead"] >= 0.02
    assert "timing_s/overhead" not in StepTimer().t


def _worker_and_batch(tmp_path, overrides=()):
    from armor_core.config.schema import load_config, to_dict
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.data import prepare_data
    from armor_core.workers.actor.worker import ActorWorker

    cfg = load_config(
        None,
        [
            "data.train_size=64",
            "data.val_size=8",
            "data.train_batch_size=8",
            "actor.ppo_mini_batch_size=8",
            "rollout.n=4",
            "actor.micro_batch_size=16",
            f"trainer.run_dir={tmp_path}",
            *overrides,
        ],
    )
    train, _ = prepare_data(cfg)
    prompts = DataProto.from_dict(tensors=dict(train.encoded["tensors"]))[:8].repeat(4, interleave=True)
    worker = ActorWorker(to_dict(cfg))
    torch.manual_seed(0)
    batch = worker.generate(prompts)
    batch["advantages"] = (
        torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0)) * batch["response_mask"]
    )
    return cfg, worker, batch


def test_actor_update_is_the_same_in_every_layout_and_reports_padding_waste(tmp_path):
    """ActorWorker in this process (no Ray): one update on grouped or packed rows has the gradient of
    the same update on padded rows, and the metrics say what the training forward computed."""
    from armor_core.config.schema import to_dict
    from armor_core.workers.actor.worker import ActorWorker

    cfg, worker, batch = _worker_and_batch(tmp_path)
    results = {}
    for layouts in ((), ("packed",), ("grouped", "packed")):
        worker = ActorWorker(to_dict(cfg))
        worker.logp.layouts = layouts
        metrics = worker.update_actor(batch, 1)
        # one mini-batch: the gradients left in .grad are the ones the optimizer stepped with
        results[layouts] = (metrics, [p.grad.clone() for p in worker.model.parameters()])
    m_pad, g_pad = results[()]
    for layouts in (("packed",), ("grouped", "packed")):
        m, g = results[layouts]
        assert m["actor/pg_loss"] == pytest.approx(m_pad["actor/pg_loss"], abs=1e-6)
        for a, b in zip(g_pad, g):
            assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max()))
        assert m["perf/padding_waste"] <= 0.10 < m_pad["perf/padding_waste"]
        assert 0 < m["perf/actor_fwd_bwd_s"] + m["perf/actor_optimizer_s"] <= m["perf/worker_s"]
    # 4 samples per prompt: 3 of every 4 prompt copies are not computed
    assert results[("packed",)][0]["perf/prompt_sharing"] == 0.0 == m_pad["perf/prompt_sharing"]
    prompt_share = float(
        batch["attention_mask"][:, : -batch["responses"].shape[1]].sum() / batch["attention_mask"].sum()
    )
    assert results[("grouped", "packed")][0]["perf/prompt_sharing"] == pytest.approx(0.75 * prompt_share)


def test_rows_with_zero_advantage_are_not_forwarded_and_the_update_is_unchanged(tmp_path):
    """GRPO groups that all scored the same have advantage 0: skipping their forward leaves the
    gradient, the loss and (over two steps, one with nothing to learn) Adam's updates as they were."""
    from armor_core.config.schema import to_dict
    from armor_core.workers.actor.worker import ActorWorker

    cfg, _, batch = _worker_and_batch(tmp_path)
    adv = batch["advantages"].clone()
    adv[::3] = 0.0  # a third of the rows carry no signal
    first = batch.select(tensor_keys=list(batch.tensors))
    first["advantages"] = adv
    second = batch.select(tensor_keys=list(batch.tensors))
    second["advantages"] = torch.zeros_like(adv)  # nothing: the gradient is 0, Adam's momentum still moves
    runs = {}
    for skip in (False, True):
        cfg.actor.skip_zero_advantage = skip
        worker = ActorWorker(to_dict(cfg))
        m1 = worker.update_actor(first, 1)
        grads = [p.grad.clone() for p in worker.model.parameters()]
        after_first = [p.detach().clone() for p in worker.model.parameters()]
        m2 = worker.update_actor(second, 2)
        after_second = [p.detach().clone() for p in worker.model.parameters()]
        assert any(not torch.equal(x, y) for x, y in zip(after_first, after_second))  # momentum moved them
        runs[skip] = (m1, m2, grads, after_second)
    (a1, a2, ga, pa), (b1, b2, gb, pb) = runs[False], runs[True]
    for x, y in zip(ga, gb):
        assert (x - y).abs().max() <= 1e-5 * max(1.0, float(x.abs().max()))
    # Adam's step is lr * m / (sqrt(v) + eps): where a gradient is within float noise of zero, its
    # direction (so up to lr of that parameter's step) is noise; compare to a tenth of lr
    for x, y in zip(pa, pb):
        assert (x - y).abs().max() <= 0.1 * cfg.actor.lr
    assert b1["actor/pg_loss"] == pytest.approx(a1["actor/pg_loss"], abs=1e-6)
    assert b1["actor/zero_adv_rows"] == pytest.approx(len(adv[::3]) / len(adv)) and "actor/zero_adv_rows" not in a1
    assert b2["actor/zero_adv_rows"] == 1.0 and b2["actor/grad_norm"] == 0.0 == a2["actor/grad_norm"]
    # the skipped rows' entropy is estimated from the sampled tokens' log-probs: close, not equal
    assert b1["actor/entropy"] == pytest.approx(a1["actor/entropy"], rel=0.25)
    assert b1["perf/actor_fwd_bwd_s"] > 0 and b2["perf/actor_fwd_bwd_s"] < a2["perf/actor_fwd_bwd_s"]
    # an entropy bonus reads every row: nothing is skipped then
    cfg.actor.skip_zero_advantage, cfg.actor.entropy_coeff = True, 0.01
    assert "actor/zero_adv_rows" not in ActorWorker(to_dict(cfg)).update_actor(first, 1)
