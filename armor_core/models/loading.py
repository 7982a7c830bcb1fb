"""Finding, loading and building models and tokenizers; turning prompts into left-padded tensors.

Everything here is local: a model is a Hugging Face causal-LM directory on disk or one of the
models shipped with ARMOR (``builtin:NAME``, found under ``armor_core/assets/NAME``).
Nothing downloads (``local_files_only=True`` everywhere), so a typo in a path is an error that
names the path, never an attempt to reach the model hub. Nothing runs a directory's own Python code
either (``trust_remote_code=False`` everywhere unless the caller passes the user's explicit option;
``remote_code.py`` says which directories that refuses).

``build_char_tokenizer`` and ``build_tiny_model``, the small models the tests and the built-in warm start use,
are ``tiny.py``'s, re-exported here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from armor_core.models.tiny import build_char_tokenizer, build_tiny_model

__all__ = [
    "BUILTIN_PREFIX",
    "ModelPathError",
    "build_char_tokenizer",
    "build_tiny_model",
    "builtin_models",
    "encode_prompts",
    "load_model",
    "load_tokenizer",
    "padding_id",
    "resolve_model_path",
]

BUILTIN_PREFIX = "builtin:"
#: files any one of which makes a directory a loadable tokenizer
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_DTYPES = ("float32", "bfloat16", "float16")


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


def padding_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id a batch is padded with: the tokenizer's pad token, else its EOS token (``load_tokenizer`` sets one)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if not isinstance(pad, int):
        raise ValueError(
            f"the tokenizer has neither a pad nor an EOS token id (got {pad!r}); "
            "load it with armor_core.models.loading.load_tokenizer"
        )
    return pad


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
