"""A sharded checkpoint's model as a Hugging Face directory, read a bucket of tensors at a time.

A checkpoint written with ``actor.checkpoint_format=sharded`` (``workers/parallel/strategy.py``'s
``save_shards``) holds ``actor_shards/``, the ``torch.distributed.checkpoint`` files every rank wrote
(``__<rank>_0.distcp`` and ``.metadata``), and ``model_config/``, the model's config and tokenizer.
``export_shards`` writes safetensors files from them in one process, without a process group: it reads the
tensors' names, shapes and dtypes from the metadata, then loads at most ``bucket_bytes`` of whole tensors
at a time (DCP assembles each from the slices the ranks wrote), writes them, and lets them go; the largest
amount held is one bucket, never the whole model.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

__all__ = ["export_shards"]

_PREFIX = "model."  # save_shards keeps the model under "model" (and the optimizer under "optimizer")


def export_shards(shards: Path, config_dir: Path, out: Path, bucket_bytes: int = 2 << 30) -> int:
    """Write ``shards``' model tensors to ``out`` as safetensors (``model.safetensors``, or numbered files and their
    index when there is more than one bucket) with ``config_dir``'s files beside them; returns the files written.

    :raises ValueError: ``shards`` holds no model tensor (not a sharded checkpoint's ``actor_shards/``).
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    tensors = {k[len(_PREFIX) :]: m for k, m in meta.items() if k.startswith(_PREFIX)}
    tensors = {k: m for k, m in tensors.items() if isinstance(m, TensorStorageMetadata)}
    if not tensors:
        raise ValueError(f"{shards} holds no model tensor; it is not a sharded checkpoint's actor_shards/")
    config = json.loads((config_dir / "config.json").read_text())
    if config.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        del tensors["lm_head.weight"]  # the same tensor as the embedding; transformers ties it on load

    def nbytes(m: TensorStorageMetadata) -> int:
        return m.size.numel() * torch.empty((), dtype=m.properties.dtype).element_size()

    buckets: list[list[str]] = [[]]
    held = 0
    for name, m in tensors.items():
        if buckets[-1] and held + nbytes(m) > bucket_bytes:
            buckets.append([])
            held = 0
        buckets[-1].append(name)
        held += nbytes(m)
    out.mkdir(parents=True, exist_ok=True)
    files = (
        ["model.safetensors"]
        if len(buckets) == 1
        else [f"model-{i + 1:05d}-of-{len(buckets):05d}.safetensors" for i in range(len(buckets))]
    )
    where: dict[str, str] = {}
    for names, file in zip(buckets, files):
        part = {n: torch.empty(tuple(tensors[n].size), dtype=tensors[n].properties.dtype) for n in names}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": part}, checkpoint_id=str(shards), no_dist=True)
        save_file({n: t.contiguous() for n, t in part.items()}, str(out / file), metadata={"format": "pt"})
        where.update(dict.fromkeys(names, file))
        del part
    if len(files) > 1:
        total = sum(nbytes(tensors[n]) for n in where)
        index = {"metadata": {"total_size": total}, "weight_map": where}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for f in config_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    return len(files)
