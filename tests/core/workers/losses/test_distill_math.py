"""On-policy distillation's math (``workers/losses/distill_loss.py``, ``workers/teacher.py``): the sampled
reverse-KL estimate agrees with the exact KL, the top-k forward KL on a hand-computed case, and the
student's and teacher's top-k log-probs through the chunked head equal the full logits'."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import build_tiny_model
from armor_core.workers.forward.layouts import forward_response_log_probs
from armor_core.workers.forward.lm_head import install_response_head
from armor_core.workers.losses.distill_loss import (
    DistillLoss,
    compute_distill_reverse_kl,
    compute_distill_topk_forward_kl,
)
from armor_core.workers.teacher import teacher_top_k

V, R = 6, 3  # a vocabulary small enough to enumerate every response: 6^3 = 216
PROMPT = [2, 4, 5]


def _tiny(seed: int) -> torch.nn.Module:
    model = build_tiny_model("qwen2", V, hidden_size=64, num_layers=1, num_heads=2, seed=seed).eval()
    with torch.no_grad():  # sharper than the initialisation, so the two models' distributions differ clearly
        model.get_output_embeddings().weight.mul_(8)
    return model


def _batch(responses: torch.Tensor) -> dict[str, torch.Tensor]:
    n = len(responses)
    ids = torch.cat([torch.tensor(PROMPT).expand(n, -1), responses], dim=1)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(ids.shape[1]).expand(n, -1),
        "responses": responses,
    }


def _log_probs(model: torch.nn.Module, responses: torch.Tensor, chunk: int) -> torch.Tensor:
    b = _batch(responses)
    lp, _, _ = forward_response_log_probs(
        model, b["input_ids"], b["attention_mask"], b["position_ids"], responses, 1.0, False, None, chunk
    )
    return lp


@torch.no_grad()
def _sample(model: torch.nn.Module, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, 0, dtype=torch.long)
    for _ in range(R):
        ids = torch.cat([torch.tensor(PROMPT).expand(n, -1), out], dim=1)
        probs = model(input_ids=ids, use_cache=False).logits[:, -1].float().softmax(-1)
        out = torch.cat([out, torch.multinomial(probs, 1, generator=g)], dim=1)
    return out


@torch.no_grad()
def test_sampled_reverse_kl_estimate_agrees_with_the_exact_kl(one_thread):
    student, teacher = _tiny(0), _tiny(1)
    install_response_head(student)  # the student's log-probs as the actor computes them: the chunked head
    every = torch.tensor(list(itertools.product(range(V), repeat=R)))
    ls, lt = _log_probs(student, every, 0).sum(-1).double(), _log_probs(teacher, every, 0).sum(-1).double()
    exact = float((ls.exp() * (ls - lt)).sum())  # KL(p_S || p_T) over every response of R tokens
    assert abs(float(ls.exp().sum()) - 1) < 1e-6 and exact > 0.5

    responses = _sample(student, 2000, seed=3)
    est = compute_distill_reverse_kl(
        _log_probs(student, responses, 4), _log_probs(teacher, responses, 0), torch.ones(len(responses), R)
    ).sum(-1)  # the per-token estimates summed over a response: its sequence-level estimate
    se = float(est.std()) / math.sqrt(len(est))
    assert abs(float(est.mean()) - exact) < 3 * se, (float(est.mean()), exact, se)
    # and the estimate is not trivially close: a teacher's log-probs dropped would be far off
    assert abs(float(_log_probs(student, responses, 0).sum(-1).mean()) - exact) > 10 * se


def test_topk_forward_kl_hand_computed():
    # one position, k = 2: teacher probabilities (0.6, 0.2), student (0.3, 0.4) at the teacher's ids
    t = torch.tensor([[[math.log(0.6), math.log(0.2)]]])
    s = torch.tensor([[[math.log(0.3), math.log(0.4)]]])
    mask = torch.ones(1, 1)
    raw = 0.6 * math.log(0.6 / 0.3) + 0.2 * math.log(0.2 / 0.4)
    assert compute_distill_topk_forward_kl(s, t, mask, renormalize=False).item() == pytest.approx(raw, abs=1e-6)
    # renormalised: the teacher's over the k, (0.75, 0.25); the student's stay its full-vocabulary ones
    renorm = 0.75 * math.log(0.75 / 0.3) + 0.25 * math.log(0.25 / 0.4)
    assert compute_distill_topk_forward_kl(s, t, mask, renormalize=True).item() == pytest.approx(renorm, abs=1e-6)
    # 0 only where the student holds the teacher's renormalised top-k exactly; the teacher's ratios alone are
    # not enough: mass the student leaves outside the k costs log(1 / its mass on the k)
    exact = torch.log(torch.tensor([[[0.75, 0.25]]]))
    assert compute_distill_topk_forward_kl(exact, t, mask).item() == pytest.approx(0.0, abs=1e-6)
    same_ratio = torch.log(torch.tensor([[[0.3, 0.1]]]))
    assert compute_distill_topk_forward_kl(same_ratio, t, mask).item() == pytest.approx(math.log(2.5), abs=1e-6)
    # masked positions are 0, and the gradient reaches the student only
    s2 = s.expand(2, 1, 2).clone().requires_grad_(True)
    out = compute_distill_topk_forward_kl(s2, t.expand(2, 1, 2), torch.tensor([[1.0], [0.0]]), renormalize=False)
    assert out[1].item() == 0.0
    out.sum().backward()
    assert torch.allclose(s2.grad[0, 0], torch.tensor([-0.6, -0.2])) and s2.grad[1].abs().sum() == 0


def test_reverse_kl_estimate_zero_outside_the_mask_and_signed():
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    tlp = torch.tensor([[-1.5, -1.0, float("nan")]])  # whatever a worker leaves on a padded position
    out = compute_distill_reverse_kl(lp, tlp, torch.tensor([[1.0, 1.0, 0.0]]))
    assert out.tolist() == [[0.5, -1.0, 0.0]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_through_the_chunked_head_equals_full_logits(one_thread, temperature):
    teacher, student = _tiny(1), _tiny(0)
    responses = _sample(student, 5, seed=1)
    b = _batch(responses)
    full = teacher(input_ids=b["input_ids"], use_cache=False).logits[:, -R - 1 : -1].float() / temperature
    want_lp, want_ids = full.log_softmax(-1).topk(3, dim=-1)
    data = DataProto.from_dict(tensors=b)
    got_lp, got_ids = teacher_top_k(teacher, data, torch.arange(5), 3, temperature, chunk=4)
    assert torch.equal(got_ids, want_ids) and torch.allclose(got_lp, want_lp, atol=1e-5)

    # the actor's side: the student's log-probs at the teacher's ids, asked in its one forward beside the
    # sampled tokens' (column 0), plain and through the chunked head
    targets = torch.cat([responses[..., None], got_ids], -1)
    ids, attn, pos = b["input_ids"], b["attention_mask"], b["position_ids"]
    plain = forward_response_log_probs(student, ids, attn, pos, targets, temperature, False, None, 0)[0][..., 1:]
    install_response_head(student)
    chunked = forward_response_log_probs(student, ids, attn, pos, targets, temperature, False, None, 4)[0][..., 1:]
    s_full = student(input_ids=b["input_ids"], use_cache=False).logits[:, -R - 1 : -1].float() / temperature
    want = s_full.log_softmax(-1).gather(-1, got_ids)
    assert torch.allclose(plain, want, atol=1e-5) and torch.allclose(chunked, want, atol=1e-5)
    # the chunked path carries the gradient to the student's weights as the full logits' does
    head = student.get_output_embeddings().weight
    (g_chunk,) = torch.autograd.grad(chunked.sum(), head)
    s_full = student(input_ids=b["input_ids"], use_cache=False).logits[:, -R - 1 : -1].float() / temperature
    (g_full,) = torch.autograd.grad(s_full.log_softmax(-1).gather(-1, got_ids).sum(), head)
    assert torch.allclose(g_chunk, g_full, atol=1e-4)


def test_reverse_kl_as_a_loss_has_the_score_function_gradient():
    """``via=loss``: d/dθ of the term is (log p_S - log p_T) * d log p_S, the estimate times the score."""
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mini = {"teacher_log_prob": torch.tensor([[-3.0, -1.0]])}
    loss = DistillLoss("reverse_kl", 1.0, True)
    assert loss.extra_ids(mini, torch.tensor([0])) is None  # the sampled tokens' log-probs are all it needs
    mat, mean_rkl = loss(mini, torch.tensor([0]), lp, torch.ones(1, 2), None)
    mat.sum().backward()
    assert lp.grad.tolist() == [[2.0, -1.0]] and mean_rkl == pytest.approx(0.5)
