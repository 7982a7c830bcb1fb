"""The critic's values in the actor's layouts (``workers/critic/values.py``): packed and grouped forwards
give the padded forward's values and the same update, with the padding counted; a layout that
changes the result is dropped with a warning; gradient checkpointing reaches the critic."""

from __future__ import annotations

import pytest
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.testing.batches import rollout_batch, shared_prompt_batch
from armor_core.workers.forward.logprobs import LayoutChoice, valid_response_positions

_OVERRIDES = [
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=1",
    "rollout.max_new_tokens=5",
    "data.max_prompt_length=6",
    "engine.cpus_per_worker=1",
    "trainer.loggers=[]",
    "algorithm.adv_estimator=gae",
    "critic.lr=1e-3",
]


def _critic(*overrides: str):
    from armor_core.config.schema import load_config, to_dict
    from armor_core.workers.critic.worker import CriticWorker

    return CriticWorker(to_dict(load_config(None, [*_OVERRIDES, *overrides])), rank=0, world_size=1)


def _batch(shared: bool) -> DataProto:
    ids, attn, pos, resp = (
        shared_prompt_batch() if shared else rollout_batch([6, 2, 4, 1, 5, 3], [5, 2, 0, 4, 1, 3], vocab=19)
    )
    ids, resp = ids % 19, resp % 19  # the built-in model's vocabulary
    R = resp.shape[1]
    mask = attn[:, -R:].clone()
    g = torch.Generator().manual_seed(3)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": resp,
            "response_mask": mask,
            "values": torch.randn(len(ids), R, generator=g) * mask,
            "returns": torch.randn(len(ids), R, generator=g) * mask,
        }
    )


def _nonzero_head(critic) -> None:
    # the head starts at zero (every value 0), which would hide any difference between layouts
    with torch.no_grad():
        critic.model.value_head.weight.normal_(generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("shared, kind", [(True, "grouped"), (False, "packed")])
def test_layouts_give_the_padded_values_and_count_the_padding_they_skip(shared, kind):
    data = _batch(shared)
    laid_out, padded = _critic(), _critic()
    padded.values.layouts = ()
    for c in (laid_out, padded):
        _nonzero_head(c)
    out, ref = laid_out.compute_values(data), padded.compute_values(data)
    counted, ref_counted = laid_out.values.padding_metrics("critic/"), padded.values.padding_metrics("critic/")
    assert laid_out.values.checked == {kind}
    R = data["responses"].shape[1]
    valid = valid_response_positions(data["attention_mask"], R)
    assert (
        torch.allclose(out["values"][valid], ref["values"][valid], atol=1e-5) and ref["values"][valid].abs().min() > 0
    )
    assert torch.equal(
        out["values"][~data["response_mask"].bool()], torch.zeros(int((~data["response_mask"].bool()).sum()))
    )
    assert (
        counted["critic/padding_waste"] < ref_counted["critic/padding_waste"]
        and ref_counted["critic/padding_waste"] > 0.3
    )
    assert (counted["critic/prompt_sharing"] > 0.2) == (kind == "grouped") and ref_counted[
        "critic/prompt_sharing"
    ] == 0.0


def test_an_update_in_a_layout_equals_the_padded_update():
    data = _batch(True)
    laid_out, padded = _critic(), _critic()
    padded.values.layouts = ()
    metrics = []
    for c in (laid_out, padded):
        _nonzero_head(c)
        metrics.append(c.update_critic(data, step=1))
    assert laid_out.values.checked == {"grouped"}
    assert (
        metrics[0]["critic/vf_loss"] == pytest.approx(metrics[1]["critic/vf_loss"], rel=1e-5)
        and metrics[0]["critic/vf_loss"] > 0
    )
    assert metrics[0]["critic/padding_waste"] < metrics[1]["critic/padding_waste"]
    # the gradients, not the weights: Adam's first step is about lr * sign(gradient), so a gradient
    # that is 0 up to rounding may step either way
    for (name, a), b in zip(laid_out.model.named_parameters(), padded.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name
    assert sum(float(p.grad.abs().sum()) for p in laid_out.model.backbone.parameters()) > 0


def test_a_layout_that_changes_the_result_is_dropped_with_a_warning():
    import contextlib

    from armor_core.models.loading import load_model, resolve_model_path

    model = load_model(resolve_model_path("builtin:arithmetic-tiny"), "float32")
    choice = LayoutChoice(model, model, torch.float32, contextlib.nullcontext, "critic rank 3", "values")
    ids, attn, pos, resp = shared_prompt_batch()
    tried = []

    def run(module, packed):  # a "model" whose grouped layout is off by 0.5 everywhere
        assert module is model  # checked on the check module
        if packed is not None:
            tried.append(packed.kind)
        return torch.full(resp.shape, 0.5 if packed is not None and packed.kind == "grouped" else 0.0)

    with pytest.warns(
        UserWarning,
        match=r"critic rank 3: the grouped layout changes this model's values \(mean \|diff\| 5.00e-01 > 1e-04\); not using it",
    ):
        packed = choice.choose(ids, attn, pos, resp.shape[1], run)
    assert (
        packed.kind == "packed"
        and tried == ["grouped", "packed"]
        and choice.layouts == ("packed",)
        and choice.checked == {"packed"}
    )
    assert choice.choose(ids, attn, pos, resp.shape[1], run).kind == "packed" and tried == [
        "grouped",
        "packed",
    ]  # checked once


def test_gradient_checkpointing_reaches_the_critic_and_changes_nothing():
    data = _batch(True)
    plain, checkpointed = _critic(), _critic("model.gradient_checkpointing=true")
    assert checkpointed.model.backbone.is_gradient_checkpointing and not plain.model.backbone.is_gradient_checkpointing
    for c in (plain, checkpointed):
        _nonzero_head(c)
        c.update_critic(data, step=1)
    for (name, a), b in zip(plain.model.named_parameters(), checkpointed.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name
