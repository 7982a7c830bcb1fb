"""Checking a weight sync (``rollout.verify_sync``): the sums, their tolerance, and ``ActorWeights.sync_weights``
catching a sync that left the rollout engine with other weights than the actor sent (a tensor skipped or
corrupted, LoRA adapters that never arrived)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from armor_core.config.schema import RolloutConfig
from armor_core.models.loading import build_tiny_model
from armor_core.models.lora import apply_lora
from armor_core.models.weight_sums import SyncCheckError, WeightSum, check_sync, weight_sum
from armor_core.stability.faults import Faults
from armor_core.workers.actor.weights import ActorWeights
from armor_plugins.rollout.hf import HFRollout

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


def _tiny() -> torch.nn.Module:
    return build_tiny_model("qwen2", 16, hidden_size=64, num_layers=2, num_heads=2, seed=0)


def test_the_sum_does_not_depend_on_how_an_engine_stacks_or_pads_rows():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 40, generator=gen) for n in (40, 8, 8))
    parts = weight_sum(q) + weight_sum(k) + weight_sum(v)
    fused = weight_sum(torch.cat([q, k, v]))  # vLLM's qkv_proj
    padded = weight_sum(torch.cat([q, torch.zeros(24, 40)]))  # a vocabulary rounded up
    experts = weight_sum(torch.stack([q, q]))  # experts in one 3-D tensor
    assert parts.mismatch(fused) <= 1.0 and weight_sum(q).mismatch(padded) <= 1.0
    assert (weight_sum(q) + weight_sum(q)).mismatch(experts) <= 1.0
    assert fused.n == 56 * 14  # every 3rd of 40 columns: 14 sampled


def test_a_bf16_copy_is_held_to_its_own_rounding_and_a_stale_one_is_caught():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 0.02
    held = w.to(torch.bfloat16)
    assert weight_sum(w, torch.bfloat16).mismatch(weight_sum(held)) == 0.0
    assert weight_sum(w).mismatch(weight_sum(held)) > 1.0  # without rounding first it would not match
    stepped = w + 1e-4 * torch.sign(torch.randn(64, 64, generator=torch.Generator().manual_seed(2)))  # one Adam step
    assert weight_sum(stepped, torch.bfloat16).mismatch(weight_sum(held)) > 1.0
    assert WeightSum(3, 1.0, 1.0).mismatch(WeightSum(4, 1.0, 1.0)) == 0.0  # zeros an engine padded with


def test_an_hf_copy_passes_and_a_corrupted_tensor_is_named():
    model = _tiny()
    roll = HFRollout(copy.deepcopy(model), None, RolloutConfig())
    state = model.state_dict()
    roll.update_weights(state.items())
    check_sync(state, roll.weight_sums, "test")
    with torch.no_grad():
        roll.model.model.layers[1].mlp.up_proj.weight[:, 0] += 1e-3  # one sampled column, slightly off
    with pytest.raises(SyncCheckError, match=r"1 of \d+ tensors differ.*model\.layers\.1\.mlp\.up_proj\.weight"):
        check_sync(state, roll.weight_sums, "test")
    with pytest.raises(SyncCheckError, match=r"not held by the engine: \['extra'\]"):
        check_sync({**state, "extra": torch.ones(2)}, roll.weight_sums, "test")


class _Copy(HFRollout):
    """A backend with weights of its own (as vLLM): a copy of the base model, sent merged LoRA layers."""

    shares_module = False
    skip: str | None = None  # a tensor its update_weights drops, as a buggy backend would

    def update_weights(self, named_tensors):
        super().update_weights((n, t) for n, t in named_tensors if n != self.skip)


def _actor(model, rollout, lora=False, verify=True) -> ActorWeights:
    actor = ActorWeights()
    actor.cfg = SimpleNamespace(rollout=RolloutConfig(backend="copy", verify_sync=verify))  # pyright: ignore
    actor.model = actor.gen_model = model
    actor.rollout, actor.lora, actor.sharded, actor.rank = rollout, lora, False, 0
    actor.faults, actor.global_step = Faults([]), 1
    return actor


def test_sync_weights_checks_the_engine_and_names_a_tensor_it_dropped():
    model = _tiny()
    actor = _actor(model, _Copy(copy.deepcopy(model), None, RolloutConfig()))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    metrics = actor.sync_weights()
    assert 0.0 <= metrics["perf/verify_sync_s"] <= metrics["perf/worker_s"] and metrics["perf/sync_gb_per_s"] > 0
    actor.rollout.skip = "model.layers.0.self_attn.k_proj.weight"
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    with pytest.raises(SyncCheckError, match=r"actor rank 0 -> copy.*model\.layers\.0\.self_attn\.k_proj\.weight"):
        actor.sync_weights()
    _actor(model, actor.rollout, verify=False).sync_weights()  # rollout.verify_sync=false: not checked


def test_lora_adapters_that_never_reach_the_engine_are_caught():
    policy = apply_lora(_tiny(), 4, 8.0, 0.0, "all-linear", seed=0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # B starts at 0: trained adapters change the merged weights
                p.copy_(torch.full_like(p, 0.05))
    rollout = _Copy(_tiny(), None, RolloutConfig())  # the base model, as the engine starts
    actor = _actor(policy, rollout, lora=True)
    actor.sync_weights()  # the merged adapted layers arrived
    rollout.update_weights = lambda named_tensors: None  # an engine that drops the adapters
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    with pytest.raises(SyncCheckError, match=r"q_proj\.weight"):
        actor.sync_weights()
