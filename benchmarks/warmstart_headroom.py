"""Does the shipped warm start leave room for RL? And how fast is the ``hf`` rollout on it?

    python benchmarks/warmstart_headroom.py [--model builtin:arithmetic-tiny] [--steps 30] [--seed 1] [--threads N]

``builtin:arithmetic-tiny`` is made deliberately half trained (~50% greedy accuracy on the
held-out arithmetic split) so that an RL recipe has something to show. This script checks that
without Ray or the trainer: a bare on-policy GRPO loop in one process (the registered ``grpo``
estimator, ``ppo_clip`` loss and ``token-mean`` aggregation, one update per batch, so the PPO ratio
is 1 and the update is a group-baselined policy gradient), with the ``hf`` rollout, the default
recipe's 8 prompts x 8 samples at temperature 1 and lr 3e-5, and exact match of the stripped
response as the reward. It prints greedy held-out accuracy before and after, and rollout speed
(after a warm-up: the first generate call is many times slower than the rest).
"""

from __future__ import annotations

import argparse
import time

import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import encode_prompts, load_model, load_tokenizer
from armor_core.plugins import get_plugin_manager
from armor_plugins.rollout.hf import HFRollout
from armor_plugins.tasks.arithmetic import generate_arithmetic


def _encode(tok, rows) -> DataProto:
    ids, mask, pos, _ = encode_prompts(tok, [r["prompt"] for r in rows], max_length=64)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def _accuracy(roll: HFRollout, tok, rows, batch: DataProto) -> float:
    out = roll.generate(batch, greedy=True)
    texts = tok.batch_decode(out["responses"], skip_special_tokens=True)
    return sum(t.strip() == r["ground_truth"] for t, r in zip(texts, rows)) / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin:arithmetic-tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    pm = get_plugin_manager()
    adv_fn = pm.get("advantage_estimator", "grpo").fn
    loss_fn = pm.get("policy_loss", "ppo_clip").fn
    agg_fn = pm.get("loss_aggregation", "token-mean").fn
    tok, model = load_tokenizer(args.model), load_model(args.model)
    cfg = RolloutConfig(n=args.n, temperature=1.0, max_new_tokens=8)
    roll = HFRollout(model, tok, cfg)
    val_rows = generate_arithmetic("test", 500, args.seed)
    val = _encode(tok, val_rows)
    train_rows = generate_arithmetic("train", args.steps * args.prompts, args.seed)

    roll.generate(val[:64])  # warm-up
    t0 = time.perf_counter()
    sampled = roll.generate(val, n=args.n)
    gen_s = time.perf_counter() - t0
    tokens = int(sampled["response_mask"].sum())
    print(
        f"hf rollout: {len(sampled)} samples, {tokens} tokens in {gen_s:.2f}s ({tokens / gen_s:.0f} tokens/s, "
        f"{len(sampled) / gen_s:.0f} samples/s)"
    )

    before = _accuracy(roll, tok, val_rows, val)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    for step in range(args.steps):
        rows = train_rows[step * args.prompts : (step + 1) * args.prompts]
        out = roll.generate(_encode(tok, rows), n=args.n)
        texts = tok.batch_decode(out["responses"], skip_special_tokens=True)
        truth = [r["ground_truth"] for r in rows for _ in range(args.n)]
        scores = torch.tensor([float(t.strip() == g) for t, g in zip(texts, truth)])
        mask = out["response_mask"]
        last = (mask.sum(-1) - 1).clamp(min=0)
        rewards = torch.zeros(mask.shape).scatter(1, last[:, None], scores[:, None])  # the score sits on the last token
        index = torch.arange(len(rows)).repeat_interleave(args.n)
        adv, _ = adv_fn(rewards, mask, index)
        R = mask.shape[1]
        model.train()
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits[:, -R - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, out["responses"][..., None]).squeeze(-1)
        loss_mat, _ = loss_fn(logp, out["rollout_log_probs"], adv, mask)
        loss = agg_fn(
            loss_mat, mask, global_num_tokens=mask.sum(), global_num_seqs=(mask.sum(-1) > 0).sum(), norm_constant=None
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 10 == 0:
            print(
                f"step {step + 1}: batch reward {scores.mean():.3f}  held-out greedy accuracy "
                f"{_accuracy(roll, tok, val_rows, val):.3f}  {time.perf_counter() - t0:.1f}s"
            )
    after = _accuracy(roll, tok, val_rows, val)
    print(f"| model | before | after {args.steps} GRPO steps | gain | RL seconds |")
    print(f"| {args.model} | {before:.3f} | {after:.3f} | {after - before:+.3f} | {time.perf_counter() - t0:.1f} |")


if __name__ == "__main__":
    main()
