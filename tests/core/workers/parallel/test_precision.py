"""Mixed precision and offload set-up (``armor_core.workers.parallel.precision``, ``parallel.strategy.wrap``).

The training side (float32 state, bf16 steps equal to float32 ones within bf16 rounding, on one
rank, DDP and FSDP2) is in ``test_parallel.py``; the bf16 run's accuracy in ``tests/e2e/test_train.py``.
"""

from __future__ import annotations

import pytest
import torch

from armor_core.workers.parallel import strategy as parallel
from armor_core.workers.parallel.precision import autocast, compute_dtype


def test_compute_dtype_checks_the_device_can_run_it(monkeypatch):
    assert compute_dtype("float32", torch.device("cpu")) is torch.float32
    assert compute_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16  # CPU autocast runs bf16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100 or T4
    with pytest.raises(
        ValueError, match=r"model.dtype=bfloat16: this GPU does not support bfloat16.*use model.dtype=float32"
    ):
        compute_dtype("bfloat16", torch.device("cuda"))


def test_autocast_is_a_no_op_for_float32_and_casts_matmuls_for_bf16():
    x = torch.ones(3, 3)
    with autocast(torch.device("cpu"), torch.float32):
        assert (x @ x).dtype == torch.float32
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), torch.bfloat16, enabled=False):  # FSDP2 casts through its policy instead
        assert (x @ x).dtype == torch.float32


def test_offload_shards_with_fsdp2_policies_even_on_one_rank(monkeypatch):
    """The GPU-only path, up to the calls into FSDP2: every decoder layer and the root get the
    CPU offload policy and the bf16 mixed-precision policy with float32 reductions."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    from armor_core.models.loading import build_tiny_model

    calls = []
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda device_type, shape: ("mesh", device_type, shape))
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((type(module).__name__, kw)))
    model = build_tiny_model("qwen2", 23, hidden_size=64, num_layers=2, num_heads=2)
    assert parallel.wrap(model, "fsdp2", 1, torch.device("cuda"), torch.bfloat16, offload=True) is model
    assert [name for name, _ in calls] == ["Qwen2DecoderLayer", "Qwen2DecoderLayer", "Qwen2ForCausalLM"]
    for _, kw in calls:
        assert kw["mesh"] == ("mesh", "cuda", (1,))
        assert isinstance(kw["offload_policy"], fsdp.CPUOffloadPolicy)
        assert kw["mp_policy"].param_dtype is torch.bfloat16 and kw["mp_policy"].reduce_dtype is torch.float32
    with pytest.raises(ValueError, match="offload needs strategy=fsdp2"):
        parallel.wrap(model, "ddp", 2, torch.device("cuda"), offload=True)
    assert parallel.wrap(model, "fsdp2", 1, torch.device("cpu")) is model  # one rank, no offload: nothing to shard
