"""Multi-turn rollouts: episodes and tokens per second, against a runner that re-tokenises the
transcript each turn, and the share of time spent waiting on tools.

    python benchmarks/multi_turn.py                       # about a minute on 2 cores
    python benchmarks/multi_turn.py --episodes 64 --turns 4 --tool-seconds 0.2

Both runners drive the same ``hf`` backend, model (the built-in tiny model) and environment: each
turn gets the observation "result: 42" and the episode ends after ``--turns`` turns; the tool sleeps
``--tool-seconds`` per call. ``armor`` is ``MultiTurnRollout``: contexts are the sampled ids plus
observation ids, environments step concurrently. ``re-tokenise`` is the common shortcut it replaces:
each turn it decodes the transcript to text, appends the observation as text and tokenises the
whole again, and steps environments one after the other. Besides being slower it is not
token-exact: ``ids changed`` counts the episodes whose trained ids differ from the sampled ones.
"""

from __future__ import annotations

import argparse
import time

import torch

from armor_core.config.schema import MultiTurnConfig, RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import EnvironmentStep
from armor_core.models.loading import encode_prompts, load_model, load_tokenizer
from armor_core.workers.rollout.multi_turn import MultiTurnRollout
from armor_plugins.rollout.hf import HFRollout
from armor_plugins.tasks.arithmetic import generate_arithmetic


def make_env(turns: int, tool_seconds: float):
    class Tool:
        waited = 0.0

        def __init__(self, row, seed=0):
            pass

        def reset(self):
            return None

        def step(self, turn):
            start = time.perf_counter()
            time.sleep(tool_seconds)
            Tool.waited += time.perf_counter() - start
            done = turn.index + 1 >= turns
            return EnvironmentStep(observation=None if done else "result: 42", done=done)

    return Tool


def retokenising(backend, tok, prompts: list[str], env_cls, turns: int, max_new: int) -> tuple[int, int]:
    """The baseline: text transcripts re-tokenised each turn, environments stepped in turn. Returns
    (tokens sampled, episodes whose final ids differ from the ids sampled)."""
    texts, sampled = list(prompts), [[] for _ in prompts]
    envs = [env_cls({}) for _ in prompts]
    for index in range(turns):
        ids, mask, pos, _ = encode_prompts(tok, texts, 10_000)
        out = backend.generate(
            DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}),
            max_new_tokens=max_new,
        )
        for i, (r, m) in enumerate(zip(out["responses"].tolist(), out["response_mask"].tolist())):
            turn = [t for t, k in zip(r, m) if k]
            sampled[i].append(turn)
            texts[i] += tok.decode(turn, skip_special_tokens=True)
            step = envs[i].step(type("Turn", (), {"index": index, "text": texts[i]})())
            if step.observation:
                texts[i] += "\n" + step.observation + "\n"
    changed = 0
    for i, text in enumerate(texts):
        final = tok(text, add_special_tokens=False)["input_ids"]
        if any(not _contains(final, turn) for turn in sampled[i] if turn):
            changed += 1
    return sum(len(t) for s in sampled for t in s), changed


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i : i + n] == part for i in range(len(seq) - n + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tool-seconds", type=float, default=0.1)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, tok = load_model("builtin:arithmetic-tiny"), load_tokenizer("builtin:arithmetic-tiny")
    rows = generate_arithmetic("test", args.episodes, seed=0)
    prompts = [r["prompt"] for r in rows]
    ids, mask, pos, _ = encode_prompts(tok, prompts, 64)
    batch = DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        non_tensors={"extra": [{} for _ in rows]},
    )
    config = RolloutConfig(
        max_new_tokens=args.max_new_tokens,
        multi_turn=MultiTurnConfig(enable=True, max_turns=args.turns, max_response_tokens=10_000),
    )
    backend = HFRollout(model, tok, config)
    env_cls = make_env(args.turns, args.tool_seconds)

    def run(name: str) -> tuple[int, int]:
        if name == "armor":
            out = MultiTurnRollout(backend, tok, config, env_cls).generate(batch)
            return int(out["response_mask"].sum()), 0
        return retokenising(backend, tok, prompts, env_cls, args.turns, args.max_new_tokens)

    table = []
    for name in ("armor", "re-tokenise"):
        torch.manual_seed(0)
        run(name)  # warm-up: a first call at new shapes is much slower on this machine
        torch.manual_seed(0)
        env_cls.waited = 0.0
        start = time.perf_counter()
        tokens, changed = run(name)
        wall = time.perf_counter() - start
        table.append((name, wall, tokens, env_cls.waited, changed))
    print(
        f"{args.episodes} episodes x {args.turns} turns, tool {args.tool_seconds:g} s per call, "
        f"{args.max_new_tokens} new tokens per turn\n"
    )
    print("| runner | seconds | episodes/s | sampled tokens/s | tool-seconds waited / wall | ids changed |")
    print("|---|---|---|---|---|---|")
    for name, wall, tokens, waited, changed in table:
        print(
            f"| {name} | {wall:.2f} | {args.episodes / wall:.1f} | {tokens / wall:.0f} | {waited / wall:.2f} | "
            f"{changed}/{args.episodes} |"
        )


if __name__ == "__main__":
    main()
