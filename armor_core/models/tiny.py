"""The small models the tests and the built-in warm start use: character-level vocabularies (one token per
character, so ``"85"`` is two tokens and arithmetic needs no tokenizer tricks) and randomly initialised Qwen2 /
Qwen3 / DeepSeek-V3 decoders built from a config. Embeddings are untied and head dims are >= 32, the smallest that
vLLM's CPU attention accepts, so the same directories load in vLLM. ``armor_core.models.loading`` re-exports both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "build_char_tokenizer", "build_tiny_model"]

SPECIAL_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


def build_char_tokenizer(chars: Iterable[str]) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``chars``, plus <pad> <eos> <bos> <unk>.

    ``chars`` is any iterable of strings; every distinct character in them becomes one token.

    Encoding prepends <bos> (so the first real character has a context token, and HF and vLLM
    tokenise a prompt the same way since both add special tokens by default); characters not in
    ``chars`` become <unk>. Ids: pad 0, eos 1, bos 2, unk 3, then ``chars`` in sorted order.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(set("".join(chars)))
    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk"]))
    # [\s\S] is any character including newlines ('.' would skip them)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # without Fuse the decoder joins tokens with spaces: "85" would decode as "8 5"
    tok.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])]
    )
    # padding_side must go to the constructor: assigned afterwards it is not saved with the tokenizer
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        padding_side="left",
    )


def build_tiny_model(
    arch: str,
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    pad_token_id: int | None = 0,
    eos_token_id: int | None = 1,
    bos_token_id: int | None = 2,
    seed: int | None = 0,
    **config_overrides: Any,
) -> PreTrainedModel:
    """A randomly initialised small causal LM, in float32, from a config (nothing is loaded).

    :param arch: ``qwen2``, ``qwen3`` or ``deepseek_v3`` (MoE with 4 routed experts, top-2, one
        shared expert, and multi-head latent attention with small ranks; layer 0 stays dense as in
        DeepSeek-V3's ``first_k_dense_replace``).
    :param hidden_size, num_heads: the head dim is ``hidden_size // num_heads`` and must be >= 32.
    :param intermediate_size: MLP width; default ``4 * hidden_size``.
    :param pad_token_id, eos_token_id, bos_token_id: defaults match :func:`build_char_tokenizer`.
    :param seed: seeds the initialisation without touching the caller's global RNG state; None
        uses the global RNG as it is.
    :param config_overrides: any other field of the architecture's transformers config.

    Qwen2 defaults (hidden 128, 4 layers, vocab ~20) give ~1.05M parameters.
    """
    if hidden_size % num_heads or hidden_size // num_heads < 32:
        raise ValueError(
            f"build_tiny_model: hidden_size={hidden_size} / num_heads={num_heads} must divide evenly into heads of "
            ">= 32 dims (vLLM's CPU attention needs head_dim >= 32)"
        )
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=config_overrides.pop(
            "tie_word_embeddings", False
        ),  # untied unless asked: vLLM reloads tied weights wrongly
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
    )
    model = _init_from_config(_tiny_config(arch, common, hidden_size // num_heads, config_overrides), seed)
    if model.generation_config is not None:
        model.generation_config.pad_token_id = pad_token_id
        model.generation_config.eos_token_id = eos_token_id
        model.generation_config.bos_token_id = bos_token_id
    return model


def _tiny_config(arch: str, common: dict[str, Any], head_dim: int, overrides: dict[str, Any]) -> Any:
    """The transformers config of ``arch`` from the fields all three share and the caller's ``overrides``."""
    from transformers import DeepseekV3Config, Qwen2Config, Qwen3Config

    if arch == "qwen2":
        return Qwen2Config(**common, **overrides)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=head_dim, **overrides)
    if arch == "deepseek_v3":
        return DeepseekV3Config(**common, **{**_deepseek_v3_fields(common["hidden_size"], head_dim), **overrides})
    raise ValueError(f"build_tiny_model: unknown arch {arch!r}; choose qwen2, qwen3 or deepseek_v3")


def _deepseek_v3_fields(hidden_size: int, head_dim: int) -> dict[str, Any]:
    """Small MoE and multi-head latent attention settings: 4 routed experts, top-2, one shared, layer 0 dense."""
    return dict(
        moe_intermediate_size=max(32, hidden_size // 2),
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=head_dim,
        qk_rope_head_dim=32,
        v_head_dim=head_dim,
    )


def _init_from_config(config: Any, seed: int | None) -> PreTrainedModel:
    """A float32 model of ``config``, initialised in a forked RNG so the caller's global state is
    left as it was: from ``seed``, or (None) from the global RNG's current state."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
