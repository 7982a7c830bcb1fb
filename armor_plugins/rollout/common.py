"""What every rollout backend shares: the sampling overrides, prompt preparation, EOS ids, and the
output layout (so ``hf`` and ``vllm`` return DataProtos the trainer cannot tell apart)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from armor_core.ops.sample_seeds import repeat_samples

__all__ = [
    "SAMPLING_OVERRIDES",
    "Sampling",
    "assemble_output",
    "eos_ids",
    "kept_bound",
    "prepare_prompts",
    "resolve_sampling",
]

SAMPLING_OVERRIDES = ("temperature", "top_p", "top_k", "max_new_tokens", "greedy", "do_sample", "n")


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_new: int
    greedy: bool
    n: int
    keep: bool = False  # record the kept set of every sampled token (sampling-mask replay)


def resolve_sampling(backend: str, config: Any, overrides: Mapping[str, Any]) -> Sampling:
    """The rollout config with ``generate(**overrides)`` applied; unknown overrides are an error."""
    unknown = sorted(set(overrides) - set(SAMPLING_OVERRIDES))
    if unknown:
        raise TypeError(
            f"{backend}.generate: unknown sampling override(s) {unknown}; accepted: {', '.join(SAMPLING_OVERRIDES)}"
        )
    temperature = float(overrides.get("temperature", config.temperature))
    s = Sampling(
        temperature=temperature,
        top_p=float(overrides.get("top_p", config.top_p)),
        top_k=int(overrides.get("top_k", config.top_k)),
        max_new=int(overrides.get("max_new_tokens", config.max_new_tokens)),
        greedy=bool(overrides.get("greedy", False)) or overrides.get("do_sample", True) is False or temperature <= 0,
        n=int(overrides.get("n", 1)),
    )
    if s.max_new < 1 or s.n < 1:
        raise ValueError(f"{backend}.generate: max_new_tokens={s.max_new} and n={s.n} must be >= 1")
    if s.greedy or not (s.top_p < 1.0 or s.top_k > 0) or not getattr(config, "sampling_replay", False):
        return s
    bound = kept_bound(config)
    if s.top_k > bound:
        raise ValueError(
            f"{backend}.generate: top_k={s.top_k} is larger than rollout.replay_max_kept={bound}, the most tokens a "
            "recorded kept set may hold; raise rollout.replay_max_kept or set rollout.sampling_replay=false"
        )
    return dataclasses.replace(s, keep=True, top_k=s.top_k or bound)


def kept_bound(config: Any) -> int:
    """``rollout.replay_max_kept``: the most tokens a recorded kept set may hold."""
    return int(getattr(config, "replay_max_kept", 256))


def prepare_prompts(backend: str, prompts: Any, n: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(prompts repeated n times interleaved, input_ids, attention_mask, position_ids)``."""
    for key in ("input_ids", "attention_mask"):
        if key not in prompts.tensors:
            raise KeyError(
                f"{backend}.generate: the prompts DataProto has no {key!r} tensor (has {sorted(prompts.tensors)})"
            )
    prompts = repeat_samples(prompts, n)
    input_ids, attention_mask = prompts.tensors["input_ids"], prompts.tensors["attention_mask"]
    position_ids = prompts.tensors.get("position_ids")
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return prompts, input_ids, attention_mask, position_ids


def assemble_output(
    prompts: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    log_probs: torch.Tensor,
    extra: dict[str, torch.Tensor] | None = None,
) -> Any:
    """The rollout contract's DataProto: prompts, responses, masks and positions of the whole sequence (and
    ``extra`` per-response-token tensors, such as the kept sets of sampling-mask replay)."""
    from armor_core.dataproto.protocol import DataProto

    device = input_ids.device
    responses, response_mask, log_probs = (x.to(device) for x in (responses, response_mask, log_probs))
    steps = torch.arange(1, responses.shape[1] + 1, device=device, dtype=position_ids.dtype)
    last_pos = (
        position_ids[:, -1:]
        if position_ids.shape[1]
        else torch.full((responses.shape[0], 1), -1, dtype=position_ids.dtype, device=device)
    )
    tensors = {
        "prompts": input_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([input_ids, responses], dim=1),
        "attention_mask": torch.cat([attention_mask.to(response_mask.dtype), response_mask], dim=1),
        "position_ids": torch.cat([position_ids, last_pos + steps], dim=1),
        "rollout_log_probs": log_probs,
        **{k: v.to(device) for k, v in (extra or {}).items()},
    }
    return DataProto.from_dict(
        tensors=tensors, non_tensors=dict(prompts.non_tensors), meta_info=dict(prompts.meta_info)
    )


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]))
    if not ids:
        raise ValueError(
            "rollout: neither the tokenizer nor the model's generation_config has an EOS token; responses would "
            "never end"
        )
    return sorted(ids)
