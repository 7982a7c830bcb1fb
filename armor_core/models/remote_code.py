"""Whether loading a model directory would run Python code found in it, and refusing that by default.

A Hugging Face directory may name its own modelling code in ``config.json``'s ``auto_map`` (and its
own tokenizer code in ``tokenizer_config.json``'s). transformers runs that code when asked with
``trust_remote_code=True``, and when the argument is left out it asks y/N in a terminal. ARMOR passes
``trust_remote_code=False`` on every load unless the user set ``model.trust_remote_code=true`` (or
``--trust-remote-code`` on ``armor eval``, ``armor sft`` and ``armor export``).

With the option off, a directory whose ``model_type`` transformers implements itself (DeepSeek-V3
checkpoints carry an ``auto_map`` too) loads with transformers' own classes and its code is not run;
a directory that only its own code can load is refused with a ``ModelPathError`` naming the option.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ALLOW_HINT", "check_remote_code", "runs_directory_code"]

ALLOW_HINT = (
    "ARMOR never runs a model directory's code unless told to: if you trust it, set model.trust_remote_code=true "
    "(armor eval, armor sft, armor export: --trust-remote-code)"
)


def _auto_map(file: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the JSON object in ``file``, its ``auto_map``); both empty when the file is absent or unreadable
    (the loaders report an unreadable file themselves)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict):
        return {}, {}
    auto_map = data.get("auto_map")
    return data, auto_map if isinstance(auto_map, dict) and auto_map else {}


def _code_files(auto_map: dict[str, Any]) -> list[str]:
    """The Python files an ``auto_map`` points at (``modeling_x.XModel`` -> ``modeling_x.py``)."""
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(r, str)]
    return sorted({r.split("--")[-1].rsplit(".", 1)[0] + ".py" for r in refs})


def check_remote_code(directory: Path, trust_remote_code: bool, *, tokenizer: bool = False) -> None:
    """Refuse ``directory`` when only its own Python code can load it and ``trust_remote_code`` is off.

    :param tokenizer: check ``tokenizer_config.json`` (a tokenizer load) instead of ``config.json``.
    :raises ModelPathError: naming the directory, the code files and the option that allows them.
    """
    from transformers import CONFIG_MAPPING

    from armor_core.models.loading import ModelPathError

    if trust_remote_code:
        return
    name = "tokenizer_config.json" if tokenizer else "config.json"
    data, auto_map = _auto_map(Path(directory) / name)
    if not auto_map:
        return
    if tokenizer:
        # transformers' own class, when the file names one, is used instead of the directory's code
        native = _native_tokenizer(data.get("tokenizer_class"))
        what = f"tokenizer_class {data.get('tokenizer_class')!r}"
    else:
        native = data.get("model_type") in CONFIG_MAPPING
        what = f"model_type {data.get('model_type')!r}"
    if native:
        return
    raise ModelPathError(
        f"model directory {str(directory)!r}: {name} names Python code in the directory "
        f"({', '.join(_code_files(auto_map))}, its auto_map) and transformers has no class of its own for its "
        f"{what}, so loading it means running that code. {ALLOW_HINT}"
    )


def _native_tokenizer(cls_name: Any) -> bool:
    if not isinstance(cls_name, str) or not cls_name:
        return False
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        return tokenizer_class_from_name(cls_name) is not None
    except Exception:  # an unknown name may fail in a dependency's import; then it is not native either
        return False


def runs_directory_code(model: Any) -> bool:
    """Whether ``model`` was built from its directory's own code (transformers keeps such classes in
    its ``transformers_modules`` package), which ARMOR loads only with ``model.trust_remote_code=true``:
    an engine that reloads the directory (vLLM) must then be allowed to run it too, and only then."""
    config = getattr(model, "config", None)
    return any(type(x).__module__.startswith("transformers_modules") for x in (model, config) if x is not None)
