"""``armor export CHECKPOINT OUT [--merge]``: a run's checkpoint as a directory others can load."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint's model (or LoRA adapter) as a plain Hugging Face directory",
        description="CHECKPOINT is a run's checkpoints/step_N directory. A LoRA run's checkpoint holds an adapter "
        "(peft format): without --merge OUT gets the adapter alone (load it with "
        "peft.PeftModel.from_pretrained on its base model); with --merge OUT gets the base model with "
        "the adapter merged in, a plain model directory for transformers or vLLM. A full fine-tuning "
        "checkpoint's model/ is copied as is; a sharded one's (actor_shards/, actor.checkpoint_format) is assembled "
        "into safetensors files a bucket of tensors at a time. Every file is first checked against the checkpoint's "
        "manifest (sizes and sha256, as --resume checks); a damaged checkpoint is refused.",
    )
    p.add_argument("checkpoint", help="a run's checkpoints/step_N directory")
    p.add_argument("out", help="directory to write (must not exist, or be empty)")
    p.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base model")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with --merge: allow running Python code from the base model's directory (its config.json auto_map)",
    )
    p.set_defaults(func=main)


def export(checkpoint: Path, out: Path, merge: bool, trust_remote_code: bool = False) -> str:
    """Write ``checkpoint``'s model to ``out``; returns what was written, in words.

    :raises CheckpointError: a file does not match the checkpoint's manifest (named).
    """
    from armor_core.models.loading import load_adapter_merged, load_tokenizer
    from armor_core.models.lora import ADAPTER_DIR
    from armor_core.storage.checkpoint import check_intact
    from armor_core.storage.shards import export_shards
    from armor_core.workers.actor.weights import ACTOR_SHARDS, MODEL_CONFIG

    adapter, full, shards = checkpoint / ADAPTER_DIR, checkpoint / "model", checkpoint / ACTOR_SHARDS
    if not adapter.is_dir() and not full.is_dir() and not shards.is_dir():
        raise ValueError(
            f"{checkpoint} is not a checkpoint: it has neither {ADAPTER_DIR}/ (a LoRA run), model/ (full "
            f"fine-tuning) nor {ACTOR_SHARDS}/ (sharded); pass a run's checkpoints/step_N directory"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; OUT must be a new (or empty) directory")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; choose a new directory (nothing is overwritten)")
    check_intact(checkpoint)  # before a byte is written: damaged weights are never shipped
    if shards.is_dir():
        files = export_shards(shards, checkpoint / MODEL_CONFIG, out)
        return f"the model assembled from its shards ({shards}) into {files} safetensors file(s)"
    if full.is_dir():
        shutil.copytree(full, out, dirs_exist_ok=True)
        return f"the full model ({full}) copied"
    if not merge:
        shutil.copytree(adapter, out, dirs_exist_ok=True)
        return "the LoRA adapter alone (peft format)"
    merged = load_adapter_merged(adapter, trust_remote_code=trust_remote_code)
    tokenizer = load_tokenizer(adapter, trust_remote_code=trust_remote_code)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return f"the base model ({merged.name_or_path}) with the LoRA adapter merged in"


def main(args: argparse.Namespace) -> int:
    try:
        what = export(Path(args.checkpoint), Path(args.out), args.merge, args.trust_remote_code)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {what}")
    return 0
