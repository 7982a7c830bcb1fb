"""Finding, loading and building models and tokenizers; turning prompts into left-padded tensors.

Everything here is local: a model is a Hugging Face causal-LM directory on disk or one of the
models shipped with ARMOR (``builtin:NAME``, found under ``armor_core/assets/NAME``).
Nothing downloads (``local_files_only=True`` everywhere), so a typo in a path is an error that
names the path, never an attempt to reach the model hub. Nothing runs a directory's own Python code
either (``trust_remote_code=False`` everywhere unless the caller passes the user's explicit option;
``remote_code.py`` says which directories that refuses).

``build_char_tokenizer`` and ``build_tiny_model`` make the small models the tests and the built-in
warm start use: character-level vocabularies (one token per character, so ``"85"`` is two tokens
and arithmetic needs no tokenizer tricks) and randomly initialised Qwen2 / Qwen3 / DeepSeek-V3
decoders built from a config. Embeddings are untied and head dims are >= 32, the smallest that
vLLM's CPU attention accepts, so the same directories load in vLLM.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "BUILTIN_PREFIX",
    "ModelPathError",
    "build_char_tokenizer",
    "build_tiny_model",
    "builtin_models",
    "encode_prompts",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]

BUILTIN_PREFIX = "builtin:"
#: files any one of which makes a directory a loadable tokenizer
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_DTYPES = ("float32", "bfloat16", "float16")
SPECIAL_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


class ModelPathError(ValueError):
    """A model or tokenizer path is missing or is not what it should be; the message says which."""


def _assets_dir() -> Path:
    return Path(str(resources.files("armor_core"))) / "assets"


def builtin_models() -> list[str]:
    """Names usable as ``builtin:NAME`` (the directories shipped under ``armor_core/assets``)."""
    root = _assets_dir()
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def resolve_model_path(path: str | Path, *, need_config: bool = True, need_tokenizer: bool = True) -> Path:
    """The local directory that ``path`` names, checked to hold what loading needs.

    :param path: ``builtin:NAME`` for a model shipped with ARMOR, or a local directory.
    :param need_config: the directory must have ``config.json`` (a model).
    :param need_tokenizer: the directory must have tokenizer files (``tokenizer.json`` or a vocab).
    :raises ModelPathError: naming the path and what was expected there.
    """
    text = str(path)
    if text.startswith(BUILTIN_PREFIX):
        name = text[len(BUILTIN_PREFIX) :]
        known = builtin_models()
        if name not in known:
            raise ModelPathError(
                f"unknown built-in model {text!r}; built-in models: "
                f"{', '.join(BUILTIN_PREFIX + k for k in known) or 'none are installed'}"
            )
        return _assets_dir() / name
    p = Path(text).expanduser()
    if not p.exists():
        raise ModelPathError(
            f"model path {text!r} does not exist; expected a local Hugging Face model directory (config.json, "
            f"weights, tokenizer) or one of: {', '.join(BUILTIN_PREFIX + k for k in builtin_models())}. ARMOR never "
            "downloads models."
        )
    if not p.is_dir():
        raise ModelPathError(
            f"model path {text!r} is a file; expected a directory holding config.json, the weights and the tokenizer"
        )
    if need_config and not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise ModelPathError(
            f"model directory {text!r} has no config.json; expected a directory written by save_pretrained()"
        )
    if need_tokenizer and not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelPathError(
            f"model directory {text!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); "
            "save the tokenizer there with tokenizer.save_pretrained(dir) or set model.tokenizer_path"
        )
    return p


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer at ``path`` (a directory or ``builtin:NAME``), set up for generation.

    Padding is on the left (prompts end where generation starts); a tokenizer without a pad
    token gets its EOS token as pad token, which is safe because padded positions are masked.

    :param trust_remote_code: the user's ``model.trust_remote_code``: only then may a tokenizer
        class from the directory's own code be run.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from armor_core.models.remote_code import check_remote_code

    directory = resolve_model_path(path, need_config=False)
    check_remote_code(directory, trust_remote_code, tokenizer=True)
    tok_config_file = directory / "tokenizer_config.json"
    saved_class = json.loads(tok_config_file.read_text()).get("tokenizer_class") if tok_config_file.is_file() else None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast") and (directory / "tokenizer.json").is_file():
        # A generic tokenizer.json (e.g. build_char_tokenizer's) is loaded exactly as saved. AutoTokenizer
        # would not: transformers 5 maps model_type qwen2 to Qwen2Tokenizer whatever tokenizer_config
        # says, and that class rebuilds the pipeline as byte-level BPE, dropping spaces and unknown
        # characters. (For digits and + - * = both give the same ids; tests/core/test_models.py checks.)
        tok = PreTrainedTokenizerFast.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=trust_remote_code
        )
    else:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelPathError(
                f"tokenizer at {str(path)!r} has neither a pad token nor an EOS token; generation needs an EOS token"
            )
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | Path, dtype: str = "float32", *, trust_remote_code: bool = False) -> PreTrainedModel:
    """The causal LM at ``path`` (a directory or ``builtin:NAME``) in ``dtype``; never downloads.

    :param trust_remote_code: the user's ``model.trust_remote_code``: only then may the directory's
        own modelling code (``config.json``'s ``auto_map``) be run.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from armor_core.models.remote_code import check_remote_code

    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {_DTYPES}")
    directory = resolve_model_path(path, need_tokenizer=False)
    if (directory / "adapter_config.json").is_file():
        return load_adapter_merged(directory, dtype, trust_remote_code=trust_remote_code)
    check_remote_code(directory, trust_remote_code)
    return AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=getattr(torch, dtype), local_files_only=True, trust_remote_code=trust_remote_code
    )


def load_adapter_merged(directory: Path, dtype: str = "float32", *, trust_remote_code: bool = False) -> PreTrainedModel:
    """A LoRA adapter directory (peft's format, e.g. a LoRA run's ``checkpoints/step_N/adapter``)
    merged into its base model: a plain causal LM. The base is the adapter's
    ``base_model_name_or_path``, which must be a local directory (loaded as :func:`load_model` does,
    with ``trust_remote_code``; peft itself runs no code from the adapter directory)."""
    import json

    from peft import PeftModel
    from safetensors import SafetensorError

    try:
        adapter_config = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelPathError(f"adapter {directory}: adapter_config.json is not valid JSON ({e})") from None
    if not isinstance(adapter_config, dict):
        raise ModelPathError(f"adapter {directory}: adapter_config.json holds no JSON object")
    base_path = adapter_config.get("base_model_name_or_path")
    if not base_path:
        raise ModelPathError(
            f"adapter {directory}: adapter_config.json names no base_model_name_or_path; set it to the base model's "
            "directory"
        )
    try:
        base = load_model(base_path, dtype, trust_remote_code=trust_remote_code)
    except ModelPathError as e:
        raise ModelPathError(
            f"adapter {directory}: its base model cannot be loaded ({e}); "
            "set base_model_name_or_path in its adapter_config.json to the base model's directory"
        ) from None
    try:
        merged = PeftModel.from_pretrained(base, str(directory)).merge_and_unload()
    except (ValueError, TypeError, KeyError, RuntimeError, OSError, SafetensorError) as e:  # peft's many kinds
        raise ModelPathError(
            f"adapter {directory}: peft cannot load it ({type(e).__name__}: {' '.join(str(e).split())[:300]}); "
            "adapter_config.json and adapter_model.safetensors must be as peft's save_pretrained() wrote them"
        ) from None
    merged.name_or_path = str(base_path)  # what a rollout engine loads from: the base directory, weights sent after
    return merged


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


def _render(
    tokenizer: PreTrainedTokenizerBase, prompt: Any, index: int, chat_template_kwargs: Mapping[str, Any] | None = None
) -> tuple[str, bool]:
    """(text, add_special_tokens) for one prompt: plain text, or chat messages through the template
    (given ``chat_template_kwargs``, e.g. ``enable_thinking``)."""
    if isinstance(prompt, str):
        return prompt, True
    if isinstance(prompt, (list, tuple)) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in prompt
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"prompt {index} is a list of chat messages but the tokenizer has no chat template; "
                "give plain-text prompts or use a tokenizer whose tokenizer_config.json has a chat_template"
            )
        # the template writes its own BOS and role markers, so no special tokens are added again
        kwargs = {"add_generation_prompt": True, **(chat_template_kwargs or {})}
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False, **kwargs)
        assert isinstance(text, str)  # tokenize=False renders text
        return text, False
    raise ValueError(
        f"prompt {index} is a {type(prompt).__name__}; expected a string or a list of {{'role', 'content'}} messages"
    )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | list[dict[str, str]]],
    max_length: int,
    truncation: str = "drop",
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Tokenise prompts into left-padded tensors ready for generation.

    :param prompts: plain strings (special tokens added, e.g. BOS) or chat message lists (rendered
        with the tokenizer's chat template, ``add_generation_prompt=True`` and
        ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``).
    :param max_length: longest prompt allowed, in tokens.
    :param truncation: for a longer prompt: ``drop`` it (left out of the output), ``left``: keep
        its last ``max_length`` tokens, ``error``: raise.
    :returns: ``input_ids``, ``attention_mask``, ``position_ids``, each (n_kept, P) int64 where P
        is the longest kept prompt, and ``kept_indices``: the index in ``prompts`` of each row.
        Position ids count real tokens only (``cumsum(mask) - 1``, 0 on padding), so a left-padded
        prompt gets the same positions as the unpadded one.
    """
    import torch

    if truncation not in ("drop", "left", "error"):
        raise ValueError(f"truncation={truncation!r} is not one of 'drop', 'left', 'error'")
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "encode_prompts: the tokenizer has no pad token; load it with armor_core.models.loading.load_tokenizer"
        )
    rows: list[list[int]] = []
    kept: list[int] = []
    for i, prompt in enumerate(prompts):
        text, add_special = _render(tokenizer, prompt, i, chat_template_kwargs)
        ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
        if len(ids) > max_length:
            if truncation == "drop":
                continue
            if truncation == "error":
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens, more than max_length={max_length} (set data.truncation to "
                    "'drop' or 'left', or raise data.max_prompt_length)"
                )
            ids = ids[-max_length:]
        rows.append(list(ids))
        kept.append(i)
    width = max((len(r) for r in rows), default=0)
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int), f"the tokenizer has no pad token id ({pad!r})"
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, ids in enumerate(rows):
        if ids:
            input_ids[j, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[j, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, kept
