"""The chunked LM head (``armor_core.workers.forward.lm_head``): log-probs, entropies and gradients equal
the full-logits computation, in every layout, tied or untied, at any temperature, without ever
holding a (tokens, vocabulary) tensor."""

from __future__ import annotations

import pytest
import torch

from armor_core.models.loading import build_tiny_model
from armor_core.testing import rollout_batch, shared_prompt_batch
from armor_core.workers.forward.layouts import forward_response_log_probs, layout_rows
from armor_core.workers.forward.lm_head import ResponseHead, chunked_log_probs, install_response_head, response_head_of

MIXED = ([6, 3, 1, 5, 2, 6, 4], [5, 1, 3, 0, 5, 2, 4])  # prompt and response lengths, one response empty


def _reference(h, w, b, targets, temperature):
    """float64 log-softmax of the full logits: the computation the chunks must reproduce."""
    z = (h.double() @ w.double().T + (b.double() if b is not None else 0)) / temperature
    logp = z.log_softmax(-1)
    many = targets.reshape(len(targets), -1)  # (N,) or (N, m) targets
    return logp.gather(-1, many).view(targets.shape), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize(
    "temperature,bias,chunk,m",
    [(1.0, False, 4, None), (0.7, True, 5, None), (1.3, False, 1000, None), (0.7, True, 5, 3)],
)
def test_chunked_values_and_gradients_equal_full_logits(temperature, bias, chunk, m):
    """m: several targets per position (a repeated one among them), their log-probs' gradients summed exactly."""
    g = torch.Generator().manual_seed(0)
    N, H, V = 23, 16, 41
    h = (torch.randn(N, H, generator=g) * 0.5).requires_grad_(True)
    w = (torch.randn(V, H, generator=g) * 0.5).requires_grad_(True)
    b = torch.randn(V, generator=g).requires_grad_(True) if bias else None
    targets = torch.randint(0, V, (N,) if m is None else (N, m), generator=g)
    if m is not None:
        targets[:, 1] = targets[:, 0]  # the same token asked twice: both terms reach its logit
    g_lp, g_ent = torch.randn(targets.shape, generator=g), torch.randn(N, generator=g)
    params = [x for x in (h, w, b) if x is not None]

    lp, ent = chunked_log_probs(h, w, b, targets, temperature, chunk, True)
    got = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), params)
    lp_ref, ent_ref = _reference(h, w, b, targets, temperature)
    want = torch.autograd.grad((lp_ref * g_lp.double()).sum() + (ent_ref * g_ent.double()).sum(), params)
    assert torch.allclose(lp.double(), lp_ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent.double(), ent_ref, rtol=1e-5, atol=1e-6)
    for a, r in zip(got, want):
        r = r.double()
        assert torch.allclose(a.double(), r, rtol=1e-5, atol=1e-6 * float(r.abs().max())), (a.double() - r).abs().max()


def test_log_prob_alone_needs_no_entropy_and_zero_gradient_rows_stay_zero():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 8, generator=g, requires_grad=True)
    w = torch.randn(11, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (6,), generator=g)
    lp, ent = chunked_log_probs(h, w, None, targets, 1.0, 4, False)
    assert ent is None
    (lp[:3].sum()).backward()  # rows 3-5 do not reach the loss
    assert torch.equal(h.grad[3:], torch.zeros_like(h.grad[3:])) and h.grad[:3].abs().sum() > 0


def test_chunk_must_be_positive():
    with pytest.raises(ValueError, match="chunk=0"):
        chunked_log_probs(torch.zeros(2, 4), torch.zeros(5, 4), None, torch.zeros(2, dtype=torch.long), 1.0, 0, False)


def _model(arch="qwen2", tied=False):
    model = build_tiny_model(
        arch, 23, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, tie_word_embeddings=tied
    ).eval()
    assert install_response_head(model) is None
    return model


def test_installed_head_keeps_parameters_names_and_tying():
    model = _model(tied=True)
    head = response_head_of(model)
    assert isinstance(head, ResponseHead) and head.weight is model.get_input_embeddings().weight
    assert "lm_head.weight" in model.state_dict()
    ids = torch.randint(3, 23, (2, 5))
    plain = build_tiny_model(
        "qwen2", 23, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, tie_word_embeddings=True
    ).eval()
    with torch.no_grad():  # without a request the head is the plain linear layer: generation is unchanged
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_a_model_that_changes_its_logits_after_the_head_keeps_the_plain_path():
    model = build_tiny_model("qwen2", 23, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    forward = model.forward
    model.forward = lambda *a, **k: type(out := forward(*a, **k))(logits=out.logits * 0.5)  # e.g. a logit scale
    assert "not its head's linear map" in install_response_head(model)
    assert type(model.lm_head) is torch.nn.Linear


LAYOUTS = {"padded": (), "packed": ("packed",), "grouped": ("grouped",)}


@pytest.mark.parametrize(
    "layout,arch,tied",
    [
        ("padded", "qwen2", False),
        ("packed", "qwen2", False),
        ("grouped", "qwen2", False),
        ("padded", "qwen2", True),
        ("grouped", "qwen2", True),
        ("packed", "qwen3", False),
        ("grouped", "deepseek_v3", False),
    ],
)
def test_chunked_forward_equals_full_logits_in_every_layout(layout, arch, tied):
    """Log-probs, entropies and every parameter's gradient through the model: chunked (3 tokens a
    block, so blocks cross rows) equal the full-logits path to float32 rounding (rtol 1e-5)."""
    model = _model(arch, tied)
    ids, attn, pos, resp = shared_prompt_batch() if layout == "grouped" else rollout_batch(*MIXED)
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()
    weights = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1))

    def run(chunk):
        model.zero_grad()
        packed = layout_rows(ids, attn, pos, R, LAYOUTS[layout])
        assert (packed.kind if packed is not None else "padded") == layout
        lp, ent, _ = forward_response_log_probs(model, ids, attn, pos, resp, 0.7, True, packed, chunk_tokens=chunk)
        ((lp * weights * valid).sum() + (ent * valid).sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]

    lp0, ent0, g0 = run(0)
    lp1, ent1, g1 = run(3)
    assert torch.allclose(lp1[valid], lp0[valid], rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent1[valid], ent0[valid], rtol=1e-5, atol=1e-6)
    for a, b in zip(g0, g1):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()


@pytest.mark.parametrize("layout", ["padded", "packed", "grouped"])
def test_several_targets_per_position_in_one_forward_equal_full_logits(layout):
    """(bs, R, m) targets (the sampled token, then k others: distillation's teacher top-k) through the
    chunked head in each layout: every log-prob, the entropy and the gradients equal the full logits'."""
    model = _model()
    ids, attn, pos, resp = shared_prompt_batch() if layout == "grouped" else rollout_batch(*MIXED)
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()
    g = torch.Generator().manual_seed(2)
    targets = torch.cat([resp[..., None], torch.randint(0, 23, (*resp.shape, 3), generator=g)], -1)
    weights = torch.randn(targets.shape, generator=g)

    def run(chunk, packed):
        model.zero_grad()
        lp, ent, _ = forward_response_log_probs(model, ids, attn, pos, targets, 0.7, True, packed, chunk_tokens=chunk)
        ((lp * weights)[valid].sum() + ent[valid].sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]

    lp0, ent0, g0 = run(0, None)  # the plain path: full logits, padded
    packed = layout_rows(ids, attn, pos, R, LAYOUTS[layout])
    lp1, ent1, g1 = run(3, packed)
    lp2, ent2, g2 = run(0, packed)  # the same layout from the full logits (a head that is no plain linear map)
    assert lp1.shape == lp2.shape == targets.shape and ent1.shape == ent2.shape == resp.shape
    assert torch.allclose(lp2[valid], lp0[valid], rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent2[valid], ent0[valid], rtol=1e-5, atol=1e-6)
    for a, b in zip(g0, g2):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()
    single, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 0.7, False, packed, chunk_tokens=3)
    assert torch.allclose(lp1[..., 0][valid], single.detach()[valid], rtol=1e-6, atol=1e-6)  # column 0: as if alone
    assert torch.allclose(lp1[valid], lp0[valid], rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent1[valid], ent0[valid], rtol=1e-5, atol=1e-6)
    for a, b in zip(g0, g1):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), (a - b).abs().max()


def test_gradient_checkpointing_gives_the_same_gradients_with_the_chunked_head():
    ids, attn, pos, resp = shared_prompt_batch()
    R = resp.shape[1]
    valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()
    grads = []
    for checkpointing in (False, True):
        model = _model().train()  # dropout is 0 in these configs; train() is what enables checkpointing
        if checkpointing:
            model.gradient_checkpointing_enable()
        lp, ent, _ = forward_response_log_probs(
            model, ids, attn, pos, resp, 1.0, True, layout_rows(ids, attn, pos, R), chunk_tokens=4
        )
        ((lp * valid).sum() + (ent * valid).sum()).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
