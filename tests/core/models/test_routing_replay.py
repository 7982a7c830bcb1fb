"""Routing replay (R3): the experts recorded at rollout are the ones the trainer's forward uses, in every layout."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import build_tiny_model, load_tokenizer
from armor_core.models.moe import routers
from armor_core.models.routing_replay import ROUTES, check_replayable, layout_routes, replaying
from armor_core.workers.forward.layouts import forward_response_log_probs
from armor_core.workers.forward.packing import pack_groups, pack_rows, packed_capacity


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:arithmetic-tiny")


@pytest.fixture(scope="module")
def moe(tok):
    return build_tiny_model("deepseek_v3", len(tok), hidden_size=64, num_layers=3, num_heads=2, seed=0).eval()


def _config(**kw):
    base = dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6, n=1, micro_batch_size=4)
    base.update(routing_replay=True, backend_kwargs=None, sampling_replay=True, replay_max_kept=256)
    return SimpleNamespace(**{**base, **kw})


def _rollout(moe, tok, **kw):
    from armor_plugins.rollout.hf import HFRollout

    enc = tok(["12+3=", "7+45=", "1+1=", "33+9="], return_tensors="pt", padding=True)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    prompts = DataProto.from_dict(
        tensors=dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask, position_ids=pos)
    )
    torch.manual_seed(0)
    return HFRollout(moe, tok, _config(**kw)).generate(prompts, n=2)


def _forced(moe, experts):
    """Biases that make every router choose ``experts`` for every token (the weights still come from the logits)."""
    bias = torch.full((4,), -50.0)
    bias[list(experts)] = 50.0
    return [(r.e_score_correction_bias, bias) for r in routers(moe)]


def test_replayed_experts_are_the_ones_a_forced_router_would_choose(moe):
    """Replaying experts (2, 3) for every token gives exactly the forward of a model whose routers pick (2, 3) by
    themselves: the chosen experts change, their weights are the router's own, recomputed from its logits."""
    ids = torch.randint(4, 19, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = moe(input_ids=ids).logits
        routes = torch.tensor([2, 3], dtype=torch.int16).expand(2 * 9, 2, 2)
        with replaying(moe, routes):
            replayed = moe(input_ids=ids).logits
        saved = [b.clone() for b, _ in _forced(moe, (2, 3))]
        try:
            for b, forced in _forced(moe, (2, 3)):
                b.copy_(forced)
            biased = moe(input_ids=ids).logits
        finally:
            for (b, _), s in zip(_forced(moe, (2, 3)), saved):
                b.copy_(s)
        again = moe(input_ids=ids).logits
    assert torch.allclose(replayed, biased, atol=1e-6)
    assert not torch.allclose(replayed, own, atol=1e-3), "the replay changed nothing"
    assert torch.equal(again, own) and all(not r._forward_hooks for r in routers(moe)), "a hook was left behind"


def test_a_token_without_a_record_keeps_its_own_choice_and_the_router_still_learns(moe):
    ids = torch.randint(4, 19, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = moe(input_ids=ids).logits
    with replaying(moe, torch.full((6, 2, 2), -1, dtype=torch.int16)):
        assert torch.allclose(moe(input_ids=ids).logits, own, atol=1e-6)
    moe.zero_grad()
    with replaying(moe, torch.tensor([0, 1], dtype=torch.int16).expand(6, 2, 2)):
        moe(input_ids=ids).logits.square().sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(moe))
    moe.zero_grad()


def test_the_hf_rollout_records_each_position_and_every_layout_replays_it(moe, tok):
    out = _rollout(moe, tok)
    ids, attn, pos, resp = (out[k] for k in ("input_ids", "attention_mask", "position_ids", "responses"))
    routes, R = out[ROUTES], resp.shape[1]
    assert routes.shape == (8, ids.shape[1], 2, 2) and routes.dtype == torch.int16
    # every attended token that is not a response's last one (it predicts nothing) was routed at rollout
    last = attn.cumsum(-1) == attn.sum(-1, keepdim=True)
    assert bool((routes[..., 0, 0] >= 0)[attn.bool() & ~last].all())
    with torch.no_grad():  # the trainer's own routing of the same tokens agrees with the rollout's where recorded
        chosen = {}
        hooks = [
            r.register_forward_hook(lambda m, a, o, i=i: chosen.__setitem__(i, o[-1]))
            for i, r in enumerate(routers(moe))
        ]
        moe(input_ids=ids, attention_mask=attn, position_ids=pos)
        for h in hooks:
            h.remove()
    own = torch.stack([chosen[0], chosen[1]], 1).view(routes.shape).sort(-1).values
    recorded = routes.long().sort(-1).values
    mask = (routes[..., 0, 0] >= 0) & attn.bool()
    assert torch.equal(own[mask], recorded[mask])
    valid = out["response_mask"].bool()
    layouts = (pack_rows(ids, attn, pos, R, packed_capacity(attn)), pack_groups(ids, attn, pos, R))
    assert [p.kind for p in layouts if p is not None] == ["packed", "grouped"]
    for packed in (None, *layouts):
        with torch.no_grad(), replaying(moe, layout_routes(routes, None if packed is None else packed.source)):
            lp, _, _ = forward_response_log_probs(moe, ids, attn, pos, resp, 1.0, False, packed)
        assert (lp - out["rollout_log_probs"])[valid].abs().max() < 1e-5, packed and packed.kind


def test_the_rollout_records_nothing_without_the_option_and_unknown_routers_are_refused(moe, tok):
    assert ROUTES not in _rollout(moe, tok, routing_replay=False)
    check_replayable(moe)

    class OddRouter(torch.nn.Module):  # weights its experts by a rule routing replay does not know
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 8))

        def forward(self, h):
            logits = h @ self.weight.T
            idx = logits.topk(2, -1).indices
            return logits, torch.ones_like(idx, dtype=logits.dtype), idx

    OddRouter.__name__ = "OddTopkRouter"
    with pytest.raises(ValueError, match="OddTopkRouter.*routing_replay=false"):
        check_replayable(torch.nn.Sequential(OddRouter()))
