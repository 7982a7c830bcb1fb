"""``armor eval MODEL_DIR --data FILE``: greedy (and optionally sampled) accuracy per data_source."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="accuracy of a model on a data file, per data_source",
        description="Generate a response for every row of --data (JSONL/Parquet, or task:NAME for a built-in "
        "task's test split) with MODEL (a local Hugging Face directory, a run's checkpoint model/ "
        "directory, or builtin:arithmetic-tiny), score it with the reward domain of its data_source, "
        "and print accuracy (score 1) and mean score per data_source. Runs in this process; no Ray. A checkpoint's "
        "files are first checked against its manifest (sizes and sha256), as --resume checks them.",
    )
    p.add_argument("model", help="model directory")
    p.add_argument("--data", required=True, help="JSONL/Parquet file, or task:NAME")
    p.add_argument("--size", type=int, default=500, help="rows for task:NAME (default 500)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="response length limit, at least 1 (default: rollout.max_new_tokens)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow running Python code from the model directory (its config.json auto_map); "
        "the same as model.trust_remote_code=true",
    )
    p.add_argument("--sampled", action="store_true", help="also report sampled accuracy at rollout.temperature")
    p.add_argument(
        "--n",
        type=int,
        default=1,
        help="samples per prompt at rollout.temperature; above 1 also reports mean@n, best@n (pass@n), maj@n",
    )
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="write one JSONL line per row: prompt, data_source, ground_truth, and per mode its responses and scores "
        "(scored as in training: an environment's reward parts included) and, with multi-turn rollouts, each "
        "episode's turns: role, text, tokens, and whether they were the policy's (sampled, trained on) or the "
        "environment's",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "overrides", nargs="*", help="config overrides, e.g. reward.domain_map... or rollout.temperature=0.7"
    )
    p.set_defaults(func=main)


def evaluate(
    model_dir: str,
    data: str,
    *,
    size: int = 500,
    overrides: Sequence[str] = (),
    sampled: bool = False,
    max_new_tokens: int | None = None,
    n: int = 1,
    output: str | None = None,
    trust_remote_code: bool = False,
) -> dict[str, float]:
    import torch

    from armor_core.config.schema import load_config
    from armor_core.loop.step import Scorer
    from armor_core.models.loading import load_model, load_tokenizer, resolve_model_path
    from armor_core.plugins import get_plugin_manager
    from armor_core.rewards.manager import RewardManager
    from armor_core.workers.rollout.backend import build_rollout

    cfg = load_config(None, list(overrides) + [f"model.path={model_dir}"])
    if max_new_tokens is not None:
        cfg.rollout.max_new_tokens = max_new_tokens
    trust = cfg.model.trust_remote_code = cfg.model.trust_remote_code or trust_remote_code
    check_model_files(model_dir, trust)
    pm = get_plugin_manager()
    path = resolve_model_path(model_dir)
    tok = load_tokenizer(path, trust_remote_code=trust)
    rewards = RewardManager(cfg.reward, pm)
    try:
        prompts = _prompts(cfg, pm, tok, rewards, data, size)
        model = load_model(path, cfg.model.dtype, trust_remote_code=trust)
        backend_cls = pm.get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        rollout = build_rollout(backend_cls, model, tok, cfg.rollout)  # episodes with environments if multi-turn
        torch.manual_seed(cfg.trainer.seed)
        result: dict[str, float] = {"rows": float(len(prompts))}
        per_row: list[dict] = [
            {"prompt": p, "data_source": s, "ground_truth": g}
            for p, s, g in zip(
                prompts.non_tensors["raw_prompt"],
                prompts.non_tensors["data_source"],
                prompts.non_tensors["ground_truth"],
            )
        ]
        scorer = Scorer(rewards, tok)  # as training scores: response_length, reward_text, environment parts
        for mode, greedy, k in (
            [("greedy", True, 1)]
            + ([("sampled", False, 1)] if sampled else [])
            + ([(f"@{n}", False, n)] if n > 1 else [])
        ):
            generate = lambda batch, greedy: rollout.generate(batch, greedy=greedy)  # noqa: E731
            result.update(_score_mode(prompts, generate, mode, greedy, k, scorer, cfg, tok, per_row))
        if output:
            _write_rows(output, per_row)
        return result
    finally:
        rewards.close()


def _prompts(cfg: Any, pm: Any, tok: Any, rewards: Any, data: str, size: int) -> Any:
    """The rows of ``data`` (a file, or ``task:NAME``'s test split), checked against their reward domains and
    encoded as the prompts of a DataProto."""
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.data import encode_dataset, load_rows, prompt_template_kwargs, task_rows

    if data.startswith("task:"):
        ds = task_rows(pm, data[5:], "test", size, cfg.trainer.seed, cfg.data.task_kwargs)
    else:
        ds = load_rows([data], skip_invalid=cfg.data.skip_invalid)
    rewards.check_rows(ds.rows, ds.source, skip_invalid=cfg.data.skip_invalid)
    enc = encode_dataset(ds, tok, cfg.data.max_prompt_length, cfg.data.truncation, prompt_template_kwargs(cfg, pm))
    return DataProto.from_dict(tensors=enc["tensors"], non_tensors=enc["non_tensors"])


def _score_mode(
    prompts: Any, generate: Any, mode: str, greedy: bool, k: int, scorer: Any, cfg: Any, tok: Any, per_row: list[dict]
) -> dict[str, float]:
    """One mode of ``armor eval`` (greedy, sampled, or ``k`` samples per prompt): generate, score, the metrics;
    each row's responses and scores are added to ``per_row``."""
    from armor_core.loop.validation import accuracy_by_source, at_n_metrics, generate_and_score, main_scores

    rows = prompts.repeat(k, interleave=True) if k > 1 else prompts
    full, scores, texts = generate_and_score(rows, generate, greedy, scorer, 1, cfg.rollout.multi_turn.enable)
    main = main_scores(full.non_tensors["reward_components"])
    if k == 1:
        metrics = accuracy_by_source(scores.numpy(), rows.non_tensors["data_source"], mode, main=main)
    else:
        metrics = at_n_metrics(main >= 1.0 - 1e-6, texts, prompts.non_tensors["data_source"], k, prefix="")
    episodes = episode_turns(full, tok) if "episode" in full.non_tensors else None
    for i, row in enumerate(per_row):
        row[mode] = {
            "responses": texts[i * k : (i + 1) * k],
            "scores": [float(x) for x in scores[i * k : (i + 1) * k]],
            **({"episodes": episodes[i * k : (i + 1) * k]} if episodes is not None else {}),
        }
    return metrics


def episode_turns(batch: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Each multi-turn episode of ``batch`` turn by turn (its ``episode`` column): the role, the text exactly as
    the policy read or wrote it (special tokens kept), the tokens, and whether they were the policy's (sampled,
    in the loss: ``response_mask`` 1) or an observation's; and why it ended."""
    out = []
    for ids, episode in zip(batch["responses"].tolist(), batch.non_tensors["episode"]):
        turns = [
            {
                "role": t["role"],
                "policy": t["role"] == "assistant",
                "tokens": t["end"] - t["start"],
                "text": tokenizer.decode(ids[t["start"] : t["end"]], skip_special_tokens=False),
            }
            for t in episode["turns"]
        ]
        out.append({"end": episode["end"], "turns": turns})
    return out


def check_model_files(model_dir: str, trust_remote_code: bool) -> None:
    """Before any weight is loaded: a checkpoint's files against its manifest (``--resume``'s check),
    then the directory as ``armor run`` checks it (headers of the weights, an adapter's config and base)."""
    from pathlib import Path

    from armor_core.errors import UserFacingError
    from armor_core.loop.preflight import check_model
    from armor_core.storage.checkpoint import check_intact, checkpoint_of
    from armor_core.workers.actor.weights import ACTOR_SHARDS

    if not Path(model_dir).exists() and (Path(model_dir).parent / ACTOR_SHARDS).is_dir():
        step = Path(model_dir).parent
        raise UserFacingError(
            f"{model_dir} does not exist: {step} is a sharded checkpoint (its model is in {ACTOR_SHARDS}/, one file "
            f"per rank); write a model directory from it with `armor export {step} OUT`, then evaluate OUT"
        )
    checkpoint = checkpoint_of(model_dir) if not model_dir.startswith("builtin:") else None
    if checkpoint is not None:
        check_intact(checkpoint)
    check_model(model_dir, trust_remote_code=trust_remote_code)


def _write_rows(output: str, rows: list[dict]) -> None:
    """One JSON line per row."""
    with open(output, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from armor_core.errors import UserFacingError

    if args.n < 1:
        raise UserFacingError(f"armor eval --n {args.n}: the number of samples per prompt must be at least 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserFacingError(
            f"armor eval --max-new-tokens {args.max_new_tokens}: a response needs at least 1 token; leave the option "
            "out to use rollout.max_new_tokens"
        )
    if args.output and not Path(args.output).resolve().parent.is_dir():  # before the generation, not after
        raise UserFacingError(
            f"armor eval --output {args.output}: the directory {Path(args.output).resolve().parent} does not exist"
        )
    result = evaluate(
        args.model,
        args.data,
        size=args.size,
        overrides=args.overrides,
        sampled=args.sampled,
        max_new_tokens=args.max_new_tokens,
        n=args.n,
        output=args.output,
        trust_remote_code=args.trust_remote_code,
    )
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k:40s} {v:.4f}" if k != "rows" else f"{k:40s} {int(v)}")
    return 0
