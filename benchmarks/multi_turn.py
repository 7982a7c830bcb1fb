"""Multi-turn rollouts: episodes and tokens per second, against a runner that re-tokenises the
transcript each turn, and the share of time spent waiting on tools; then time per episode of ARMOR's
environments (a tool in-process and over MCP, a textarena game).

    python benchmarks/multi_turn.py                       # about a minute on 2 cores
    python benchmarks/multi_turn.py --episodes 64 --turns 4 --tool-seconds 0.2
    python benchmarks/multi_turn.py --environments-only   # the second table alone

Both runners drive the same ``hf`` backend, model (the built-in tiny model) and environment: each
turn gets the observation "result: 42" and the episode ends after ``--turns`` turns; the tool sleeps
``--tool-seconds`` per call. ``armor`` is ``MultiTurnRollout``: contexts are the sampled ids plus
observation ids, environments step concurrently. ``re-tokenise`` is the common shortcut it replaces:
each turn it decodes the transcript to text, appends the observation as text and tokenises the
whole again, and steps environments one after the other. Besides being slower it is not
token-exact: ``ids changed`` counts the episodes whose trained ids differ from the sampled ones.

A second table times ARMOR's own environments, one ``MultiTurnRollout`` batch of ``--episodes`` episodes each, on
the ``tools-tiny`` warm start: ``recipe:tools``' held-out rows with its ``lookup`` tool called in-process, the same
rows with the same tool served over MCP (``mcp_table_server.py``, a stdio child process; the prompts, the sampled
ids and the tool's answers are the same, so the difference is the transport), and textarena's
``GuessTheNumber-v0`` (``--no-game`` leaves it out). Each row is the median of ``--repeats`` batches after a
warm-up one (which starts the MCP server), the rows taking turns. ``ms per tool call`` is the environment's
``tool_seconds`` per call, with every episode's call of a turn in flight at once. The game's rules are longer than
the model's 256 positions: its prompts keep their last 160 tokens and the tiny model's moves are rarely valid, so
that row times the game's steps and the rollout, not play.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from armor_core.config.schema import ArmorConfig, MultiTurnConfig, RolloutConfig, load_config
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import EnvironmentStep
from armor_core.loop.data import prepare_data
from armor_core.models.loading import encode_prompts, load_model, load_tokenizer
from armor_core.plugins import get_plugin_manager
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


MCP_SERVER = Path(__file__).resolve().parent / "mcp_table_server.py"


def environment_configs(episodes: int, game: bool = True) -> dict[str, ArmorConfig]:
    """The second table's rows: a name and the config whose held-out rows and environment it times."""
    tools = ["data.train_size=8", f"data.val_size={episodes}"]
    builtin = load_config("recipe:tools", tools)
    mcp = load_config("recipe:tools", tools)
    server = {"name": "tables", "command": sys.executable, "args": [str(MCP_SERVER)], "hidden": ["table"]}
    mcp.rollout.multi_turn.environment_kwargs = {"tools": [], "timeout_s": 5, "mcp_servers": [server]}
    configs = {"tools, lookup in-process": builtin, "tools, lookup over MCP (stdio)": mcp}
    if game:
        kwargs = "{env_id: GuessTheNumber-v0}"
        configs["textarena GuessTheNumber-v0"] = load_config(None, [
            "model.path=builtin:tools-tiny", "data.task=text_game", f"data.task_kwargs={kwargs}", "data.train_size=8",
            f"data.val_size={episodes}", "data.max_prompt_length=160", "data.truncation=left",
            "rollout.max_new_tokens=8", "rollout.multi_turn.enable=true", "rollout.multi_turn.environment=textarena",
            f"rollout.multi_turn.environment_kwargs={kwargs}", "rollout.multi_turn.max_turns=4",
            "rollout.multi_turn.max_response_tokens=90", "rollout.multi_turn.max_observation_tokens=24",
        ])  # fmt: skip
    return configs


def time_environments(
    episodes: int, game: bool = True, repeats: int = 9
) -> list[tuple[str, float, dict[str, float], list]]:
    """Each row of ``environment_configs``: (name, median seconds of ``repeats`` batches, the last batch's env/
    metrics and sampled ids). Every row plays a warm-up batch first (it starts the MCP server), then the rows take
    turns batch by batch, so that a machine's drift falls on each of them alike."""
    model, tok = load_model("builtin:tools-tiny"), load_tokenizer("builtin:tools-tiny")
    pm, runs = get_plugin_manager(), {}
    for name, cfg in environment_configs(episodes, game).items():
        _, val = prepare_data(cfg, pm, tok)
        assert val is not None
        encoded = val.encoded  # type: ignore[attr-defined]
        batch = DataProto.from_dict(tensors=encoded["tensors"], non_tensors=encoded["non_tensors"])
        env_cls = pm.get("environment", cfg.rollout.multi_turn.environment)
        runs[name] = (MultiTurnRollout(HFRollout(model, tok, cfg.rollout), tok, cfg.rollout, env_cls), batch)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    outs = {}
    for _ in range(1 + repeats):
        for name, (rollout, batch) in runs.items():
            torch.manual_seed(0)
            start = time.perf_counter()
            outs[name] = rollout.generate(batch)
            walls[name].append(time.perf_counter() - start)
    rows = []
    for name, out in outs.items():
        ids = [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"])]
        rows.append((name, statistics.median(walls[name][1:]), out.meta_info["metrics"], ids))
    return rows


def print_environments(rows: list[tuple[str, float, dict[str, float], list]], episodes: int, repeats: int) -> None:
    print(f"\n{episodes} episodes a batch, builtin:tools-tiny, median of {repeats} batches after a warm-up one\n")
    print(
        "| environment | seconds | ms per episode | turns / episode | tool calls / episode | ms per tool call "
        "| same ids as in-process |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, wall, metrics, ids in rows:
        calls = metrics.get("env/tool_calls", 0.0)
        per_call = f"{1000 * metrics['env/tool_seconds'] / calls:.1f}" if calls else "-"
        same = ("yes" if ids == rows[0][3] else "no") if name.startswith("tools") else "-"
        print(
            f"| {name} | {wall:.2f} | {1000 * wall / episodes:.1f} | {metrics['env/turns']:.2f} | {calls:.2f} | "
            f"{per_call} | {same} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tool-seconds", type=float, default=0.1)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--no-game", action="store_true", help="leave the textarena row out of the second table")
    ap.add_argument("--environments-only", action="store_true", help="print only the second table")
    ap.add_argument("--repeats", type=int, default=9, help="timed batches per row of the second table (the median)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if not args.environments_only:
        runners(args)
    rows = time_environments(args.episodes, not args.no_game, args.repeats)
    print_environments(rows, args.episodes, args.repeats)


def runners(args: argparse.Namespace) -> None:
    """The first table: ARMOR's runner against the re-tokenising one, on a sleeping tool."""
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
