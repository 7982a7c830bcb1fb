"""``armor reward DOMAIN``: score your own examples with a reward domain before a long run.

    armor reward math --input rows.jsonl > scores.jsonl
    armor reward math --prompt "1+1?" --response "\\boxed{2}" --ground-truth 2
    armor reward math -i rows.jsonl -p require_format=boxed -p fallback_last_number=true

Each input line is a JSON object ``{prompt, response, ground_truth, ...}`` (other fields reach the
domain as ``extra``; verl's ``reward_model.ground_truth`` is accepted). One JSON line is written per
input row, in order: ``{"line", "score", "sub_scores"}``, plus ``"error"`` when the domain failed
on the row (it then has ``reward.failure_score``) or, without a score, when the row is malformed.
A malformed row (not JSON, not UTF-8, no response, a ground truth the domain's
``validate_ground_truth`` refuses, as training refuses it when the data loads) is also reported on
stderr with its line number; the others are still scored. With ``--response`` such a ground truth is
a usage error. Scoring goes through the same RewardManager as training (same parameters, time limit,
workers). Exit status: 0 if every row scored, 1 if some row was malformed or failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import IO, Any, Callable, Iterator, TextIO

__all__ = ["add_parser", "main"]

_BATCH = 256


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``reward`` subcommand to an argparse ``subparsers`` object; it runs ``main``."""
    doc = (__doc__ or "").split("\n\n", 1)
    p = subparsers.add_parser(
        "reward",
        help="score responses with a reward domain",
        description=doc[0],
        epilog=doc[1] if len(doc) > 1 else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("domain", help="the reward domain (`armor plugins` lists them)")
    p.add_argument("--input", "-i", metavar="ROWS.jsonl", help="JSONL rows to score; '-' reads stdin")
    p.add_argument("--prompt", default="", help="one example: the prompt")
    p.add_argument("--response", help="one example: the response to score")
    p.add_argument("--ground-truth", dest="ground_truth", help="one example: the ground truth")
    p.add_argument("--extra", help="one example: other row fields, as a JSON object")
    p.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a domain parameter (reward.domain_kwargs.DOMAIN.KEY); VALUE is read as JSON if it parses (3, true, "
        '["en"]), else as text',
    )
    p.add_argument(
        "--config",
        metavar="RUN.yaml",
        help="take timeout_s, failure_score, num_workers, domain_kwargs and the domains of reward.custom, remote, "
        "model and judge from this run config's reward section",
    )
    p.add_argument("--output", "-o", metavar="OUT.jsonl", help="write the JSON lines here instead of stdout")
    p.add_argument("--timeout", type=float, help="hard time limit per row in seconds, > 0 (reward.timeout_s)")
    p.add_argument(
        "--workers",
        type=int,
        help="scoring processes, at least 1 (reward.num_workers; without it, one started on first use)",
    )
    p.set_defaults(func=main)
    return p


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _config(args: argparse.Namespace) -> Any:
    from armor_core.config.schema import ConfigError, RewardConfig, load_config

    cfg = load_config(args.config).reward if args.config else RewardConfig()
    params = dict(cfg.domain_kwargs.get(args.domain) or {})
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r} is not KEY=VALUE (for example require_format=boxed)")
        params[key.strip()] = _value(value)
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(
            f"--timeout {args.timeout}: give the time limit per row as a number of seconds > 0, e.g. --timeout 10"
        )
    if args.workers is not None and args.workers < 1:
        raise ConfigError(
            f"--workers {args.workers}: give the number of scoring processes, at least 1 "
            "(leave it out to start one helper process on first use, as reward.num_workers=0 does)"
        )
    # the CLI scores DOMAIN itself: the run's data_source routing does not apply
    return RewardConfig(
        domain_map={},
        failure_score=cfg.failure_score,
        domain_kwargs={**cfg.domain_kwargs, args.domain: params},
        timeout_s=args.timeout if args.timeout is not None else cfg.timeout_s,
        num_workers=args.workers if args.workers is not None else cfg.num_workers,
        custom=cfg.custom,  # domains the run config adds from files, services, models and judges
        remote=cfg.remote,
        model=cfg.model,
        judge=cfg.judge,
    )


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):  # chat messages
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return "" if prompt is None else str(prompt)


def _extra(row: dict) -> dict:
    """What the domain gets as ``extra``: the row's other fields, as training gives them."""
    return {k: v for k, v in row.items() if k not in ("prompt", "response", "ground_truth")}


def _rows(
    stream: IO, requires_gt: bool, refusal: Callable[[Any, dict], str | None]
) -> Iterator[tuple[int, dict | None, str | None]]:
    """``(line number, row, None)`` or ``(line number, None, what is wrong)``; blank lines skipped.
    ``stream`` yields bytes (decoded here, line by line, so a bad byte is reported on its line) or text.
    ``refusal(ground_truth, extra)``: why the domain refuses a row's ground truth, or None."""
    from armor_core.rewards.manager import ground_truth_of

    for n, line in enumerate(stream, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield (
                    n,
                    None,
                    f"not UTF-8 text (byte 0x{line[e.start]:02x}, the line's byte {e.start + 1}); save the file as "
                    "UTF-8",
                )
                continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            yield n, None, f"not valid JSON ({e.msg} at column {e.colno})"
            continue
        if not isinstance(row, dict):
            yield n, None, f"expected a JSON object {{prompt, response, ground_truth, ...}}, got {type(row).__name__}"
        elif not isinstance(row.get("response"), str):
            yield n, None, "no 'response' string"
        elif requires_gt and ground_truth_of(row) is None:
            yield n, None, "no 'ground_truth', which this domain requires"
        elif ground_truth_of(row) is not None and (problem := refusal(ground_truth_of(row), _extra(row))):
            yield n, None, problem
        else:
            yield n, row, None


class _Scorer:
    """Scores rows in batches and writes every result, malformed rows included, in input order."""

    def __init__(self, manager: Any, domain: str, out: TextIO, where: str) -> None:
        self.manager, self.domain, self.out, self.where = manager, domain, out, where
        self.pending: list[tuple[int, dict | None, str | None]] = []
        self.scored = self.failed = self.malformed = 0
        self.total = 0.0

    def add(self, n: int, row: dict | None, problem: str | None) -> None:
        self.pending.append((n, row, problem))
        if sum(r is not None for _, r, _ in self.pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        from armor_core.rewards.manager import ground_truth_of

        rows = [r for _, r, _ in self.pending if r is not None]
        batch = None
        if rows:
            extras = [_extra(r) for r in rows]
            batch = self.manager.score(
                [_prompt_text(r.get("prompt")) for r in rows],
                [r["response"] for r in rows],
                [self.domain] * len(rows),
                [ground_truth_of(r) for r in rows],
                extras,
            )
        i = 0
        prefix = f"{self.domain}/"
        for n, row, problem in self.pending:
            if row is None:
                self.malformed += 1
                print(f"{self.where}:{n}: malformed row: {problem}", file=sys.stderr)
                record: dict[str, Any] = {"line": n, "error": f"malformed row: {problem}"}
            else:
                subs = {
                    k[len(prefix) :]: float(v[i])
                    for k, v in batch.sub_scores.items()  # type: ignore[union-attr]
                    if k.startswith(prefix) and k != f"{prefix}score" and v[i] == v[i]
                }
                record = {"line": n, "score": float(batch.scores[i]), "sub_scores": subs}  # type: ignore[union-attr]
                self.scored += 1
                self.total += record["score"]
                if batch.errors[i]:  # type: ignore[union-attr]
                    record["error"] = batch.errors[i]  # type: ignore[union-attr]
                    self.failed += 1
                i += 1
            self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()
        self.pending = []


def _open_output(path: str) -> TextIO:
    """``--output``, opened for writing; ``OSError`` with a message that says which path and why."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise OSError(f"cannot write --output {path!r}: the directory {str(folder)!r} does not exist (create it first)")
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise OSError(f"cannot write --output {path!r}: {e.strerror}") from None


def _one_example(args: argparse.Namespace, manager: Any, extra: dict, requires_gt: bool) -> int:
    """``--response``: score one example, printed as one JSON line; its exit status."""
    from armor_core.rewards.manager import ground_truth_of

    if requires_gt and ground_truth_of({"ground_truth": args.ground_truth}) is None:
        given = "an empty one" if args.ground_truth is not None else "none"
        print(
            f"error: armor reward: domain {args.domain!r} requires --ground-truth (got {given}; training "
            "refuses such a row too)",
            file=sys.stderr,
        )
        return 2
    problem = None if args.ground_truth is None else manager.ground_truth_problem(args.domain, args.ground_truth, extra)
    if problem:  # one line, exit 2: training refuses such a row when the data loads
        print(f"error: armor reward: --ground-truth {args.ground_truth!r}: {problem}", file=sys.stderr)
        return 2
    batch = manager.score([args.prompt], [args.response], [args.domain], [args.ground_truth], [extra])
    prefix = f"{args.domain}/"
    subs = {
        k[len(prefix) :]: float(v[0])
        for k, v in batch.sub_scores.items()
        if k.startswith(prefix) and k != f"{prefix}score" and v[0] == v[0]
    }
    record: dict[str, Any] = {"score": float(batch.scores[0]), "sub_scores": subs}
    if batch.errors[0]:
        record["error"] = batch.errors[0]
    print(json.dumps(record, ensure_ascii=False))
    return 1 if batch.errors[0] else 0


def main(args: argparse.Namespace) -> int:
    """Run ``armor reward``; returns the exit status."""
    from armor_core.config.schema import ConfigError
    from armor_core.plugins import PluginError, UnknownPluginError
    from armor_core.rewards.manager import RewardManager

    if (args.input is None) == (args.response is None):
        print(
            "error: armor reward: give either --input ROWS.jsonl or --response TEXT (with --prompt, --ground-truth)",
            file=sys.stderr,
        )
        return 2
    try:
        extra = json.loads(args.extra) if args.extra else {}
        if not isinstance(extra, dict):
            raise ConfigError(f"--extra must be a JSON object, got {args.extra!r}")
        manager = RewardManager(_config(args))
        requires_gt = manager.domain(args.domain).requires_ground_truth

        def refusal(ground_truth: Any, row_extra: dict) -> str | None:
            return manager.ground_truth_problem(args.domain, ground_truth, row_extra)
    except json.JSONDecodeError as e:
        print(f"error: armor reward: --extra is not valid JSON: {e}", file=sys.stderr)
        return 2
    except (ConfigError, PluginError, UnknownPluginError) as e:
        print(f"error: armor reward: {e}", file=sys.stderr)
        return 2
    with manager:
        if args.response is not None:
            return _one_example(args, manager, extra, requires_gt)
        try:
            source = getattr(sys.stdin, "buffer", sys.stdin) if args.input == "-" else open(args.input, "rb")
        except OSError as e:
            print(f"error: armor reward: cannot read --input {args.input!r}: {e.strerror}", file=sys.stderr)
            return 2
        try:
            out = _open_output(args.output) if args.output else sys.stdout
        except OSError as e:
            if args.input != "-":
                source.close()
            print(f"error: armor reward: {e}", file=sys.stderr)
            return 2
        try:
            scorer = _Scorer(manager, args.domain, out, "<stdin>" if args.input == "-" else args.input)
            for n, row, problem in _rows(source, requires_gt, refusal):
                scorer.add(n, row, problem)
            scorer.flush()
        finally:
            if args.input != "-":
                source.close()
            if out is not sys.stdout:
                out.close()
    mean = scorer.total / scorer.scored if scorer.scored else float("nan")
    print(
        f"armor reward {args.domain}: {scorer.scored} rows scored (mean {mean:.4f}), {scorer.failed} failed, "
        f"{scorer.malformed} malformed",
        file=sys.stderr,
    )
    return 1 if scorer.failed or scorer.malformed else 0
