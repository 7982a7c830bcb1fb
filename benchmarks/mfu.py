"""Training-side efficiency on this CPU: model FLOP/s of ARMOR's actor update as a share of the
measured matmul peak, and the padding the training forward computes.

    python benchmarks/mfu.py [--threads N] [--hidden 384] [--layers 4] [--response-length 32]

Peak: the median FLOP/s of a large float32 ``torch.mm`` (``--mm-size``, default 4096 x 4096),
after warm-up, on the same thread count as the training step.

Achieved: ``ActorWorker.update_actor`` itself (the packed forward, the GRPO loss, backward, the
AdamW step: the code a real run executes, not a toy loop) on a ~10M-parameter Qwen2 built from
config with the built-in character tokenizer, on a GRPO batch of 16 prompts x 8 samples: built-in
arithmetic prompts and random responses whose lengths are uniform in [R/2, R]. Model FLOPs =
6 x parameters x tokens (forward and backward; attention's own FLOPs are left out, as usual),
divided by the median update time after warm-up, for each training-forward layout: ``grouped``
(each shared prompt once, the default), ``packed`` (padding removed) and ``padded``. Two rates:
*hardware* counts the tokens the layout must compute (a shared prompt once), which is the MFU;
*effective* counts every row's tokens (prompt copies too), the work a trainer without prompt sharing
does for the same update. Also printed: ``perf/padding_waste`` (padded positions computed per
needed token) of those updates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def matmul_peak(size: int, reps: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(times)


def build_worker(tmp: Path, hidden: int, layers: int, heads: int, max_new: int):
    """An ActorWorker (in this process, no Ray) on a fresh ~10M-parameter Qwen2 saved under ``tmp``."""
    from armor_core.config.schema import load_config, to_dict
    from armor_core.models.loading import build_tiny_model, load_tokenizer, resolve_model_path
    from armor_core.workers.actor.worker import ActorWorker
    from armor_core.workers.common import quiet_transformers

    quiet_transformers()
    tokenizer = load_tokenizer(resolve_model_path("builtin:arithmetic-tiny"))
    model = build_tiny_model(
        "qwen2",
        len(tokenizer),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=4 * hidden,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        max_position_embeddings=max(256, 2 * max_new),
    )
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    cfg = load_config(
        None,
        [
            f"model.path={tmp / 'model'}",
            f"rollout.max_new_tokens={max_new}",
            f"trainer.run_dir={tmp / 'run'}",
            "data.train_size=64",
            "data.val_size=8",
        ],
    )
    return ActorWorker(to_dict(cfg)), cfg


def grpo_batch(cfg, response_length: int, seed: int = 0):
    """16 built-in arithmetic prompts x 8 samples, random response tokens of lengths in [R/2, R]."""
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.data import prepare_data

    train, _ = prepare_data(cfg)
    enc = train.encoded["tensors"]
    prompts = DataProto.from_dict(tensors={k: v[:16] for k, v in enc.items()}).repeat(8, interleave=True)
    g = torch.Generator().manual_seed(seed)
    bs, R = len(prompts), response_length
    lengths = torch.randint(R // 2, R + 1, (bs,), generator=g)
    resp_mask = (torch.arange(R)[None, :] < lengths[:, None]).long()
    responses = torch.where(
        resp_mask.bool(), torch.randint(3, 19, (bs, R), generator=g), torch.zeros(bs, R, dtype=torch.long)
    )
    last = prompts["position_ids"][:, -1:]
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts["input_ids"], responses], 1),
            "attention_mask": torch.cat([prompts["attention_mask"], resp_mask], 1),
            "position_ids": torch.cat([prompts["position_ids"], last + torch.arange(1, R + 1)], 1),
            "responses": responses,
            "response_mask": resp_mask,
            "advantages": torch.randn(bs, R, generator=g) * resp_mask,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--response-length", type=int, default=32)
    ap.add_argument("--mm-size", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        worker, cfg = build_worker(Path(tmp), a.hidden, a.layers, a.heads, a.response_length)
        torch.set_num_threads(a.threads)  # after the worker: it sets its own thread count
        peak = matmul_peak(a.mm_size)
        batch = grpo_batch(cfg, a.response_length)
        params = sum(p.numel() for p in worker.model.parameters())
        real_tokens = int(batch["attention_mask"].sum())
        rows = []
        for layouts in (("grouped", "packed"), ("packed",), ()):
            worker.logp.layouts = layouts
            times, waste, sharing = [], [], []
            for step in range(a.warmup + a.steps):
                t0 = time.perf_counter()
                m = worker.update_actor(batch, step + 1)
                times.append(time.perf_counter() - t0)
                waste.append(m["perf/padding_waste"])
                sharing.append(m["perf/prompt_sharing"])
            step_s = statistics.median(times[a.warmup :])
            needed = real_tokens * (1 - statistics.median(sharing))
            rows.append(
                (
                    layouts[0] if layouts else "padded",
                    step_s,
                    6 * params * needed / step_s,
                    6 * params * real_tokens / step_s,
                    statistics.median(waste),
                )
            )

    print(
        f"threads {a.threads}; float32 matmul peak ({a.mm_size}x{a.mm_size} torch.mm, median of 5): "
        f"{peak / 1e9:.1f} GFLOP/s"
    )
    print(
        f"model: Qwen2 hidden {a.hidden}, {a.layers} layers, {params / 1e6:.2f}M parameters; batch: 128 rows, "
        f"{real_tokens} real tokens (prompts 7, responses {a.response_length // 2}-{a.response_length})"
    )
    print(
        f"\n{'training forward':18} {'s/update':>9} {'hardware GFLOP/s':>17} {'% of peak':>10} "
        f"{'effective GFLOP/s':>18} {'padding waste':>14}"
    )
    for kind, step_s, flops, effective, waste in rows:
        print(
            f"{kind:18} {step_s:9.3f} {flops / 1e9:17.1f} {100 * flops / peak:9.1f}% {effective / 1e9:18.1f} "
            f"{100 * waste:13.1f}%"
        )


if __name__ == "__main__":
    main()
