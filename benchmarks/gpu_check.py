"""The GPU check: GRPO at real scale, with the `hf` and the `vllm` rollout, on one GPU.

    python benchmarks/gpu_check.py                      # Qwen2.5-0.5B shapes, bf16, 20 steps per backend
    python benchmarks/gpu_check.py --backends vllm --steps 10 --max-new-tokens 512
    python benchmarks/gpu_check.py --preset tiny --device cpu --steps 2 --warmup 0 --backends hf   # the CPU smoke run
    python benchmarks/gpu_check.py --ranks 2 --resume-ranks 1   # FSDP2 on 2 GPUs (NCCL), then resumed on 1

A Qwen2-architecture model with Qwen2.5-0.5B's shapes (vocabulary 151,936, hidden 896, 24 layers,
14 query / 2 key-value heads, MLP 4864; the head untied, since vLLM reloads tied weights wrongly:
0.63B parameters) is built from config with random weights (nothing is downloaded) and saved with
the built-in character tokenizer. Each backend then runs ``--steps`` GRPO steps of the built-in
task through the whole trainer (Ray, the colocated actor worker) in bf16 mixed precision, with the
chunked LM head and token-budget micro-batches; the vLLM engine sleeps (level 1: weights to host
memory, KV cache freed) between generation and training. A random model scores 0 everywhere, so
``actor.skip_zero_advantage=false`` keeps every row in the update: the work is that of a real step.

With ``--ranks N`` (> 1) the actor trains with FSDP2 on N ranks, one GPU each (NCCL; gloo on CPU): generation from
the shards (``hf``) or an engine per rank synced from them a bucket at a time (``vllm``), and the run's last
checkpoint written sharded, each rank its part. ``--resume-ranks M`` then resumes that checkpoint on M ranks for
two more steps and reports whether they ran and their policy loss (a resume at another world size).

Printed per backend, medians over the steps after ``--warmup``: tokens/s of the whole step (prompt
+ response tokens), response tokens/s of generation, the peak GPU memory (the torch allocator's
peak in the update, and the device's memory in use after it, a sleeping engine included), the
weight sync in seconds per GB of weights in bf16, and the mean and max |log pi_trainer -
log pi_rollout| on the sampled tokens before the first optimizer step of each update.

The rollout samples with ``--top-p 0.9 --top-k 20`` by default, so the check covers sampling-mask replay
(``docs/off-policy.md``): the log-prob gap is then over the kept sets, and stays at the engine's rounding only if
the sets the backend recorded are the ones it sampled from (``kept mass``: their mean mass; ``--top-p 1 --top-k 0``
samples untruncated). ``rollout.sampling_replay=false`` as an override shows the gap without replay. Routing replay
on a mixture of experts (``hf``) has its own check on the same GPU: ``python benchmarks/routing_replay.py --device
cuda``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

PRESETS = {
    # Qwen2.5-0.5B's config, with an untied head
    "0.5b": dict(
        vocab_size=151_936,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        rope_theta=1_000_000.0,
    ),
    # the same vocabulary on a model small enough for the CPU smoke run
    "tiny": dict(
        vocab_size=151_936,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=256,
        rope_theta=10_000.0,
    ),
}
BACKENDS = ("hf", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="0.5b", help="model shapes (random weights)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--steps", type=int, default=20, help="GRPO steps per backend")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    p.add_argument("--batch", type=int, default=16, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384, help="actor.max_tokens_per_micro_batch")
    p.add_argument(
        "--sleep-level",
        type=int,
        choices=[0, 1, 2],
        default=1,
        help="vLLM sleep between generation and training (0: never)",
    )
    p.add_argument(
        "--keep", metavar="DIR", help="keep the model and the runs under DIR (default: a temporary directory, removed)"
    )
    p.add_argument("--ranks", type=int, default=1, help="actor ranks, one GPU each; > 1: FSDP2, sharded checkpoint")
    p.add_argument(
        "--resume-ranks", type=int, default=0, help="resume the run's last checkpoint on this many ranks (0: do not)"
    )
    p.add_argument(
        "--top-p", type=float, default=0.9, help="rollout.top_p: truncated sampling, which sampling-mask replay covers"
    )
    p.add_argument("--top-k", type=int, default=20, help="rollout.top_k (0: off)")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON instead of a table")
    p.add_argument("overrides", nargs="*", help="further config overrides (key=value) for every run")
    args = p.parse_args(argv)
    if args.resume_ranks < 0:
        p.error(f"--resume-ranks must be 0 (no resume) or more, got {args.resume_ranks}")
    for name in ("steps", "batch", "n", "max_new_tokens", "max_tokens_per_micro_batch", "ranks"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.warmup < args.steps:
        p.error(
            f"--warmup must be in [0, --steps) so that some steps are measured; got {args.warmup} with --steps {args.steps}"
        )
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides are key=value, got {bad[0]!r}")
    return args


def model_kwargs(preset: str, max_positions: int) -> dict:
    """Keyword arguments of ``armor_core.models.loading.build_tiny_model`` for a preset."""
    shape = dict(PRESETS[preset])
    vocab = shape.pop("vocab_size")
    return dict(
        arch="qwen2", vocab_size=vocab, max_position_embeddings=max_positions, tie_word_embeddings=False, **shape
    )


def count_parameters(preset: str) -> int:
    """Parameters of a preset, counted on the meta device (nothing allocated)."""
    import torch

    from armor_core.models.loading import build_tiny_model

    with torch.device("meta"):
        model = build_tiny_model(**model_kwargs(preset, 4096), seed=None)
    return sum(p.numel() for p in model.parameters())


def build_model_dir(out: Path, preset: str, max_positions: int) -> int:
    """Save a random model of ``preset`` with the built-in tokenizer under ``out``; returns its parameter count."""
    from armor_core.models.loading import build_tiny_model, load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("builtin:arithmetic-tiny"))
    model = build_tiny_model(
        **model_kwargs(preset, max_positions),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def overrides(
    args: argparse.Namespace, backend: str, model_dir: Path, run_dir: Path, ranks: int | None = None, steps: int = 0
) -> list[str]:
    """The config of one backend's run (on ``ranks``, default ``--ranks``; for ``steps``, default ``--steps``)."""
    ranks = ranks or args.ranks
    out = [
        f"model.path={model_dir}",
        f"model.dtype={args.dtype}",
        f"trainer.device={args.device}",
        f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={steps or args.steps}",
        f"trainer.save_freq={args.steps}",  # the run's last step: what --resume-ranks resumes
        f"actor.num_workers={ranks}",
        "trainer.val_freq=0",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
        f"data.train_batch_size={args.batch}",
        f"actor.ppo_mini_batch_size={args.batch}",
        f"rollout.n={args.n}",
        "data.val_size=16",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"actor.max_tokens_per_micro_batch={args.max_tokens_per_micro_batch}",
        "actor.skip_zero_advantage=false",
        "actor.lr=1e-6",
        f"rollout.backend={backend}",
        f"rollout.top_p={args.top_p}",
        f"rollout.top_k={args.top_k}",
    ]
    if ranks > 1:
        out.append("actor.strategy=fsdp2")  # actor.checkpoint_format auto: sharded
    if args.device == "cuda":
        out.append("engine.gpus_per_worker=1")
    if backend == "vllm":
        out.append(f"rollout.backend_kwargs.sleep_level={args.sleep_level}")
    return [*out, *args.overrides]


def summarize(rows: list[dict], warmup: int, weight_gb: float, rows_per_step: int) -> dict:
    """Medians over the measured steps of a run's metrics rows (one per step, in order); each step
    generates ``rows_per_step`` responses."""
    steps = [r for r in rows if "timing_s/step" in r][warmup:]
    if not steps:
        raise ValueError(f"no measured steps: {len(rows)} metrics rows, warm-up {warmup}")

    def med(key: str) -> float:
        vals = [r[key] for r in steps if key in r]
        return statistics.median(vals) if vals else float("nan")

    def peak(key: str) -> float:
        return max((r[key] for r in steps if key in r), default=float("nan"))

    gen_tps = [
        r["response_length/mean"] * rows_per_step / r["timing_s/gen"] for r in steps if r.get("timing_s/gen", 0) > 0
    ]
    sync = [r["timing_s/update_weights"] / weight_gb for r in steps if r.get("timing_s/update_weights", 0) > 0]
    return {
        "steps": len(steps),
        "step_s": med("timing_s/step"),
        "tokens_per_s": med("perf/throughput"),
        "gen_tokens_per_s": statistics.median(gen_tps) if gen_tps else float("nan"),
        "peak_allocated_gb": peak("perf/max_memory_allocated_gb"),
        "gpu_used_gb": peak("perf/gpu_memory_used_gb"),
        "max_rss_gb": peak("perf/max_rss_gb"),
        "sync_s_per_gb": statistics.median(sync) if sync else 0.0,
        "logprob_diff_mean": med("rollout/logprob_diff_mean"),
        "logprob_diff_max": peak("rollout/logprob_diff_max"),
        "kept_mass": med("rollout/kept_mass"),
    }


def format_table(results: dict[str, dict]) -> str:
    cols = [
        ("backend", None),
        ("step s", "step_s"),
        ("tokens/s", "tokens_per_s"),
        ("gen tokens/s", "gen_tokens_per_s"),
        ("peak alloc GB", "peak_allocated_gb"),
        ("GPU used GB", "gpu_used_gb"),
        ("sync s/GB", "sync_s_per_gb"),
        ("dlogp mean abs", "logprob_diff_mean"),
        ("dlogp max abs", "logprob_diff_max"),
        ("kept mass", "kept_mass"),
        ("ranks", "ranks"),
        ("resumed", "resumed"),
    ]
    rows = []
    for backend, s in results.items():
        if "error" in s:
            rows.append([backend, s["error"]] + [""] * (len(cols) - 2))
            continue
        cells = [backend]
        for _, key in cols[1:]:
            v = s.get(key, "-")
            cells.append(
                v
                if isinstance(v, str)
                else "-"
                if v != v
                else (f"{v:.2e}" if key.startswith("logprob") else f"{v:,.3g}" if v < 100 else f"{v:,.0f}")
            )
        rows.append(cells)
    header = [c for c, _ in cols]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def preflight(args: argparse.Namespace) -> str | None:
    """Why this machine cannot run the check as asked, or None."""
    import importlib.util

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        return (
            "no CUDA GPU here (torch.cuda.is_available() is False); this check is for a GPU machine. "
            "For the CPU smoke run: --preset tiny --device cpu --steps 2 --warmup 0 --backends hf"
        )
    if "vllm" in args.backends and importlib.util.find_spec("vllm") is None:
        return "--backends includes vllm, but vLLM is not installed (pip install vllm on a GPU machine); or pass --backends hf"
    return None


def run_backend(args: argparse.Namespace, backend: str, model_dir: Path, run_dir: Path, weight_gb: float) -> dict:
    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    cfg = load_config(None, overrides(args, backend, model_dir, run_dir))
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = {**summarize(rows, args.warmup, weight_gb, args.batch * args.n), "ranks": args.ranks}
    if args.resume_ranks:
        summary["resumed"] = resume_elsewhere(args, backend, model_dir, run_dir)
    return summary


def resume_elsewhere(args: argparse.Namespace, backend: str, model_dir: Path, run_dir: Path) -> str:
    """Resume the run's last checkpoint on ``--resume-ranks`` ranks for two more steps: ``"N->M: pg_loss x, y"``
    (a checkpoint written on N ranks loaded on M), or what went wrong."""
    import math

    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    where = f"{args.ranks}->{args.resume_ranks}"
    cfg = load_config(None, overrides(args, backend, model_dir, run_dir, ranks=args.resume_ranks, steps=args.steps + 2))
    trainer = Trainer(cfg, resume=True)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["actor/pg_loss"] for r in rows if r.get("step", 0) > args.steps and "actor/pg_loss" in r]
    if len(losses) != 2 or not all(math.isfinite(x) for x in losses):
        return f"{where}: FAILED (policy losses after the resume: {losses})"
    return f"{where}: pg_loss {losses[0]:.3g}, {losses[1]:.3g}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = preflight(args)
    if why:
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="armor-gpu-check-"))
    try:
        n_params = build_model_dir(root / "model", args.preset, 64 + args.max_new_tokens + 64)
        weight_gb = n_params * (2 if args.dtype == "bfloat16" else 4) / 1e9
        print(
            f"model: {args.preset} ({n_params / 1e9:.3f}B parameters, {weight_gb:.2f} GB in {args.dtype}); "
            f"{args.steps} steps x {args.batch} prompts x {args.n} samples, up to {args.max_new_tokens} new tokens, on {args.device}"
        )
        results = {}
        for backend in args.backends:
            try:
                results[backend] = run_backend(args, backend, root / "model", root / f"run-{backend}", weight_gb)
            except Exception as e:  # noqa: BLE001 - one backend's failure must not hide the other's numbers
                results[backend] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]}
        print(json.dumps(results, indent=1) if args.json else format_table(results))
        return 1 if any("error" in s for s in results.values()) else 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
