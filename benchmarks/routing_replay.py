"""Routing replay on a mixture-of-experts policy: how often the trainer routes a token to other experts than the
rollout did, and the rollout/trainer log-prob gap with and without replaying the rollout's routes.

    python benchmarks/routing_replay.py [--model builtin:moe-tiny] [--engines float32 bfloat16] [--prompts 128]
                                        [--device cpu | cuda]

The hf rollout samples ``--prompts`` x ``--n`` responses (temperature 1) from the model's weights in each dtype (an
engine in float32, and one holding bfloat16 weights as inference engines do), recording the experts every token was
routed to (``rollout.routing_replay``). A float32 trainer then scores the same tokens, in the padded layout and in
the packed one the actor uses, routing by itself ("own") and with the rollout's routes ("replayed"). Columns: the
share of routed (position, MoE layer) pairs whose expert set the trainer chooses differently; the mean and largest
|trainer - rollout| log-prob over response tokens; how many response tokens follow a position routed differently
(their log-prob depends on it), and the gap on them and on the others. Replay removes the routing part of the gap;
what is left is the arithmetic of another engine (bf16 rounding). ``--device cuda`` runs rollout and trainer on a
GPU, whose kernels differ between a cached decode step and a full forward more than this CPU's do.
"""

from __future__ import annotations

import argparse

import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import encode_prompts, load_model, load_tokenizer
from armor_core.models.routing_replay import ROUTES, RouteRecorder, layout_routes, replaying
from armor_core.workers.forward.layouts import forward_response_log_probs
from armor_core.workers.forward.packing import pack_rows, packed_capacity

__all__ = ["main"]


def _prompts(tok: object, count: int) -> DataProto:
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    texts = [r["prompt"] for r in generate_arithmetic("test", count, seed=0)]
    ids, mask, pos, _ = encode_prompts(tok, texts, 32)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


@torch.no_grad()
def _after_a_flip(model: torch.nn.Module, out: DataProto) -> tuple[torch.Tensor, float]:
    """(rows, R) response tokens that follow a position the trainer routes unlike the rollout (their log-prob
    depends on it through attention), and the share of routed (position, layer) pairs routed unlike it."""
    ids, attn, pos, resp = (out[k] for k in ("input_ids", "attention_mask", "position_ids", "responses"))
    watch = RouteRecorder(model)
    with watch.recording():
        model(input_ids=ids, attention_mask=attn, position_ids=pos)
        own = watch.take(len(ids)).long().sort(-1).values
    recorded = out[ROUTES].long().sort(-1).values
    known = recorded[..., 0] >= 0
    differ = (own != recorded).any(-1) & known  # (rows, T, layers)
    T, R = ids.shape[1], resp.shape[1]
    after = differ.any(-1).long().cumsum(-1)[:, T - R - 1 : T - 1] > 0
    return after, float(differ.sum()) / max(int(known.sum()), 1)


@torch.no_grad()
def _gap(model: torch.nn.Module, out: DataProto, packed: bool, replay: bool) -> torch.Tensor:
    """(rows, R) |trainer - rollout| log-prob, the trainer in the padded or packed layout, routing by itself or
    replaying the rollout's routes."""
    ids, attn, pos, resp = (out[k] for k in ("input_ids", "attention_mask", "position_ids", "responses"))
    layout = pack_rows(ids, attn, pos, resp.shape[1], packed_capacity(attn)) if packed else None
    routes = layout_routes(out[ROUTES], layout.source if layout is not None else None) if replay else None
    with replaying(model, routes):
        lp, _, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False, layout)
    return (lp.float() - out["rollout_log_probs"].float()).abs()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:moe-tiny")
    ap.add_argument("--engines", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    from armor_plugins.rollout.hf import HFRollout

    tok = load_tokenizer(args.model)
    prompts = _prompts(tok, args.prompts).to(args.device)
    trainer = load_model(args.model).eval().to(args.device)
    print(
        f"model {args.model}, {args.prompts} prompts x {args.n} samples, temperature 1, hf rollout, float32 trainer\n"
    )
    print(
        "| rollout weights | pairs routed unlike the rollout | trainer layout | routing | gap mean | gap max | "
        "tokens after a flip | gap there | gap elsewhere |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for dtype in args.engines:
        engine = load_model(args.model, dtype=dtype).eval().to(args.device)
        torch.manual_seed(1)
        out = HFRollout(engine, tok, RolloutConfig(max_new_tokens=args.max_new_tokens, routing_replay=True)).generate(
            prompts, n=args.n
        )
        mask = out["response_mask"].bool()
        after, differ = _after_a_flip(trainer, out)
        for packed in (False, True):
            for replay in (False, True):
                gap = _gap(trainer, out, packed, replay)
                there, elsewhere = gap[mask & after], gap[mask & ~after]
                print(
                    f"| {dtype} | {100 * differ:.2f}% | {'packed' if packed else 'padded'} | "
                    f"{'replayed' if replay else 'own'} | {float(gap[mask].mean()):.2e} | {float(gap[mask].max()):.2e} | "
                    f"{int(there.numel())} of {int(mask.sum())} | "
                    f"{float(there.mean()) if there.numel() else 0.0:.2e} | {float(elsewhere.mean()):.2e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
