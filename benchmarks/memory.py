"""Peak memory and time per token of the actor's log-prob passes at a real vocabulary.

    python benchmarks/memory.py [--lengths 512 2048 8192] [--rows 4] [--chunk 1024] [--threads N]
    python benchmarks/memory.py --sweep 256 512 1024 2048 4096 [--lengths 2048]

A Qwen2-architecture model built from config (vocabulary 151,936 as in Qwen2/Qwen2.5, hidden 64,
2 layers, untied head: the vocabulary dominates, as it does for a user's model on one GPU), random
weights, ``--rows`` rows of a 64-token prompt and a response of each ``--lengths`` tokens. Two
passes, each with the plain path (``actor.logprob_chunk_tokens=0``: the full logits) and the chunked
path (``--chunk`` tokens per block through the LM head):

- *update*: the actor's update on one micro-batch: ``forward_response_log_probs`` with entropy,
  a policy-gradient loss with an entropy bonus, backward, an AdamW step;
- *reference*: the no-grad pass of the reference and old-log-prob computations.

Each case runs in its own process. *Peak above baseline* is the process's peak RSS minus its RSS
once the model, its gradients and the AdamW state exist (after a 1-row, 8-token warm-up update), so
it is what the pass itself adds. The plain path runs only where its estimate (5 float32 copies of
the (rows, R, V) logits for the update, 2 for the reference) fits in ``--plain-limit-gb``; elsewhere
the table says why it was not run. Time per token is the median of ``--reps`` timed passes after one
untimed pass, divided by rows x R.

Targets (issue 15): at 4 x 8192 the chunked update's peak is at most 3 GB above the baseline, and
where both paths run the chunked path costs at most 1.3x the plain path's time per token. With
``--sweep``, the chunked update runs once per chunk size instead (the data behind the default of
``actor.logprob_chunk_tokens``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 151_936
PROMPT = 64
PEAK_TARGET_GB = 3.0
TIME_TARGET = 1.3


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run_case(
    pass_: str, chunk: int, rows: int, length: int, reps: int, vocab: int, hidden: int, layers: int, threads: int
) -> dict:
    """One case in this process: returns peak bytes above the baseline and seconds per token."""
    import torch

    from armor_core.models.loading import build_tiny_model
    from armor_core.workers.common import quiet_transformers
    from armor_core.workers.forward.layouts import forward_response_log_probs
    from armor_core.workers.forward.lm_head import install_response_head

    quiet_transformers()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_tiny_model(
        "qwen2",
        vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=max(1, hidden // 32),
        max_position_embeddings=PROMPT + length + 8,
        attn_implementation="sdpa",
    )
    if chunk:
        why = install_response_head(model)
        if why:
            raise SystemExit(f"memory.py: the chunked head cannot apply to this model: {why}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def batch(n: int, r: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(n * 100_003 + r)
        ids = torch.randint(3, vocab, (n, PROMPT + r), generator=g)
        attn = torch.ones_like(ids)
        pos = torch.arange(PROMPT + r).expand(n, -1).contiguous()
        adv = torch.randn(n, 1, generator=g)
        return ids, attn, pos, ids[:, PROMPT:], adv

    def update(ids, attn, pos, resp, adv) -> None:
        lp, ent, _ = forward_response_log_probs(model, ids, attn, pos, resp, 1.0, True, None, chunk)
        loss = -(lp * adv).mean() - 1e-3 * ent.mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # gradients stay allocated: part of the baseline

    def reference(ids, attn, pos, resp, adv) -> None:
        with torch.no_grad():
            forward_response_log_probs(model, ids, attn, pos, resp, 1.0, False, None, chunk)

    step = update if pass_ == "update" else reference
    update(*batch(1, 8))  # allocates gradients and the AdamW state
    baseline = rss_bytes()
    data = batch(rows, length)
    step(*data)  # untimed: the first call on this machine is slow, and it sets the peak
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step(*data)
        times.append(time.perf_counter() - t0)
    return {
        "pass": pass_,
        "chunk": chunk,
        "rows": rows,
        "length": length,
        "baseline_gb": baseline / 1e9,
        "peak_above_gb": (peak_rss_bytes() - baseline) / 1e9,
        "s_per_ktok": statistics.median(times) / (rows * length) * 1e3,
    }


def plain_estimate_gb(pass_: str, rows: int, length: int, vocab: int) -> float:
    """What the plain path needs for its logits: 5 (rows, R, V) float32 tensors in an update, 2 without grad."""
    return (5 if pass_ == "update" else 2) * rows * length * vocab * 4 / 1e9


def spawn(args: argparse.Namespace, pass_: str, chunk: int, length: int) -> dict:
    """Run one case in a fresh process (a process's peak RSS only ever grows)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--case",
        pass_,
        str(chunk),
        str(length),
        "--rows",
        str(args.rows),
        "--reps",
        str(args.reps),
        "--vocab",
        str(args.vocab),
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {
            "pass": pass_,
            "chunk": chunk,
            "rows": args.rows,
            "length": length,
            "error": f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['killed'])[-1]}",
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_row(r: dict) -> list[str]:
    path = f"chunked ({r['chunk']})" if r["chunk"] else "plain"
    shape = f"{r['rows']} x {r['length']}"
    if "error" in r:
        return [r["pass"], shape, path, "-", "-", r["error"]]
    return [r["pass"], shape, path, f"{r['peak_above_gb']:.2f}", f"{r['s_per_ktok']:.2f}", r.get("note", "")]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def check_targets(results: list[dict]) -> list[str]:
    """The issue's two targets, as lines of 'met' or 'MISSED' (empty where a target has no data)."""
    lines = []
    by = {(r["pass"], r["length"], bool(r["chunk"])): r for r in results if "error" not in r and "skipped" not in r}
    big = [r for r in results if r["pass"] == "update" and r["chunk"] and "error" not in r and "skipped" not in r]
    if big:
        top = max(big, key=lambda r: r["length"])
        ok = top["peak_above_gb"] <= PEAK_TARGET_GB
        lines.append(
            f"{'met' if ok else 'MISSED'}: chunked update at {top['rows']} x {top['length']}: "
            f"{top['peak_above_gb']:.2f} GB above baseline (target <= {PEAK_TARGET_GB:.0f} GB)"
        )
    for (pass_, length, chunked), r in sorted(by.items()):
        plain = by.get((pass_, length, False))
        if chunked and plain:
            ratio = r["s_per_ktok"] / plain["s_per_ktok"]
            lines.append(
                f"{'met' if ratio <= TIME_TARGET else 'MISSED'}: {pass_} at {r['rows']} x {length}: chunked/plain "
                f"time per token {ratio:.2f}x (target <= {TIME_TARGET}x); peak {plain['peak_above_gb']:.2f} -> "
                f"{r['peak_above_gb']:.2f} GB"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192], help="response lengths R (tokens)")
    p.add_argument("--rows", type=int, default=4)
    from armor_core.config.schema import ActorConfig

    p.add_argument(
        "--chunk",
        type=int,
        default=ActorConfig().logprob_chunk_tokens,
        help="tokens per block of the chunked path (default: actor.logprob_chunk_tokens's)",
    )
    p.add_argument(
        "--sweep",
        type=int,
        nargs="+",
        metavar="CHUNK",
        help="time the chunked update for each of these chunk sizes instead",
    )
    p.add_argument("--passes", nargs="+", choices=["update", "reference"], default=["update", "reference"])
    p.add_argument("--reps", type=int, default=2, help="timed passes per case, after one untimed pass")
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--plain-limit-gb",
        type=float,
        default=12.0,
        help="run the plain path only where its logits' estimate fits in this",
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON list instead of a table")
    p.add_argument("--case", nargs=3, metavar=("PASS", "CHUNK", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("rows", "reps", "vocab", "hidden", "layers", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if any(n < 1 for n in args.lengths) or args.chunk < 1 or any(c < 1 for c in args.sweep or []):
        p.error("--lengths, --chunk and --sweep take positive token counts")
    if args.case:
        pass_, chunk, length = args.case[0], int(args.case[1]), int(args.case[2])
        print(
            json.dumps(
                run_case(pass_, chunk, args.rows, length, args.reps, args.vocab, args.hidden, args.layers, args.threads)
            )
        )
        return 0

    results = []
    if args.sweep:
        for length in args.lengths:
            for chunk in args.sweep:
                results.append(spawn(args, "update", chunk, length))
    else:
        for pass_ in args.passes:
            for length in args.lengths:
                need = plain_estimate_gb(pass_, args.rows, length, args.vocab)
                if need <= args.plain_limit_gb:
                    results.append(spawn(args, pass_, 0, length))
                else:
                    results.append(
                        {
                            "pass": pass_,
                            "chunk": 0,
                            "rows": args.rows,
                            "length": length,
                            "skipped": True,
                            "error": f"not run: its logits need ~{need:.0f} GB (> --plain-limit-gb "
                            f"{args.plain_limit_gb:g})",
                        }
                    )
                results.append(spawn(args, pass_, args.chunk, length))
    if args.json:
        print(json.dumps(results))
        return 0
    base = next((r["baseline_gb"] for r in results if "baseline_gb" in r), float("nan"))
    print(
        f"vocabulary {args.vocab:,}, hidden {args.hidden}, {args.layers} layers, prompt {PROMPT} tokens, "
        f"{args.threads} threads; baseline (model + gradients + AdamW state) {base:.2f} GB RSS"
    )
    print(
        table(
            ["pass", "rows x R", "path", "peak above baseline (GB)", "ms / token", "note"],
            [fmt_row(r) for r in results],
        )
    )
    if args.sweep:
        return 0
    verdicts = check_targets(results)
    print("\n".join(verdicts))
    return 1 if any(line.startswith("MISSED") for line in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
