"""Memory per rank, checkpoint cost per rank and resume across world sizes, at Qwen2.5-0.5B's shapes.

    python benchmarks/sharding.py                          # 0.5B shapes, N = 1, 2, 4 (about 15 minutes on 2 cores)
    python benchmarks/sharding.py --shape small --ranks 1 2  # a quick look

The model has Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864,
vocabulary 151,936, tied embeddings: 494M parameters) with random weights, built from its config
(``build_tiny_model``; nothing is downloaded). Each world size N runs ``ActorWorker`` itself on N
processes joined in one gloo group (no Ray, no rollout): ``actor.strategy=fsdp2`` for N > 1, one plain
process for N = 1. The batch (``--rows`` rows of ``--prompt`` + ``--response`` tokens, fixed seed, the
same at every N) is split over the ranks as the driver splits it.

Printed, per N (the rank with the most, where ranks differ):

- memory per rank in an update (the second of the process: gradients and AdamW state exist), from the
  tensors: parameters, gradients and AdamW state (the rank's shards under FSDP2), the rollout copy (a full
  float32 copy to generate from: none when FSDP2 generates from the shards, the default;
  ``actor.fsdp_generation=copy`` keeps one), and the update's peak RSS above the RSS before it (activations,
  gathered layers, allocator slack); then the process's peak RSS over its whole life.
- a checkpoint: seconds to save and bytes each rank writes, in the full form (gathered to rank 0)
  and the sharded one (``actor.checkpoint_format=sharded``), the RSS each save adds at its peak, and
  seconds to load the sharded checkpoint.
- resume across world sizes: the sharded checkpoint N = 2 wrote after two updates, loaded at N = 1 and
  N = 4, and the next update's entropy and gradient norm against N = 2's own next update (relative
  difference; the policy loss of a fresh batch without old log-probs does not depend on the weights).

Memory is load-independent; the seconds are not: run it on an idle machine. Results also go to
``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

SHAPES = {
    "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab=151936),
    "small": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024, vocab=32000),
}
GB = 1e9


def build_model(shape: str, directory: Path) -> int:
    from armor_core.models.tiny import build_char_tokenizer, build_tiny_model

    s = dict(SHAPES[shape])
    vocab = s.pop("vocab")
    model = build_tiny_model("qwen2", vocab, max_position_embeddings=4096, tie_word_embeddings=True, **s)  # pyright: ignore[reportArgumentType]
    model.save_pretrained(directory, safe_serialization=True)
    build_char_tokenizer("0123456789+-=? abcdefghijklmnopqrstuvwxyz").save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


class RssPeak:
    """The highest RSS of this process while the block runs, sampled every 5 ms."""

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        self.before = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def added(self) -> float:
        return (self.peak - self.before) / GB


def make_batch(rows: int, prompt: int, response: int):
    import torch

    from armor_core.dataproto.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 40, (rows, prompt + response), generator=g)
    attention_mask = torch.ones_like(ids)
    lengths = torch.randint(response // 2, response + 1, (rows,), generator=g)
    response_mask = (torch.arange(response).unsqueeze(0) < lengths.unsqueeze(1)).long()
    attention_mask[:, prompt:] = response_mask
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response, generator=g) * response_mask,
        }
    )


def _config(model_dir: str, world: int, rows: int, response: int, prompt: int, fmt: str) -> dict:
    from armor_core.config.schema import load_config, to_dict

    return to_dict(
        load_config(
            None,
            [
                f"model.path={model_dir}",
                f"actor.strategy={'fsdp2' if world > 1 else 'ddp'}",
                f"actor.checkpoint_format={fmt}",
                f"data.train_batch_size={rows}",
                f"actor.ppo_mini_batch_size={rows}",
                "rollout.n=1",
                f"rollout.max_new_tokens={response}",
                f"data.max_prompt_length={prompt}",
                "actor.micro_batch_size=1",
                "guard.guards=[{name: non_finite}]",
                "trainer.loggers=[]",
                "engine.cpus_per_worker=1",
            ],
        )
    )


def _bytes(tensors) -> int:
    from armor_core.workers.parallel.strategy import local_part

    return sum(local_part(t).numel() * local_part(t).element_size() for t in tensors)


def _written(directory: Path, rank: int, sharded: bool) -> int:
    """Bytes this rank wrote into a checkpoint directory."""
    if sharded:
        return (directory / "actor_shards" / f"__{rank}_0.distcp").stat().st_size
    rng = directory / f"actor_rng_rank{rank}.safetensors"
    if rank:
        return rng.stat().st_size
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and "rng_rank" not in p.name) + (
        rng.stat().st_size
    )


def _rank(
    rank: int, world: int, model_dir: str, work: str, args: dict, load_from: str | None, save: str | None
) -> dict:
    import torch
    import torch.distributed as dist

    from armor_core.engine import balanced_split
    from armor_core.workers.actor.worker import ActorWorker

    torch.set_num_threads(max(1, 2 // world))
    rows, prompt, response = args["rows"], args["prompt"], args["response"]
    out: dict = {}
    w = ActorWorker(_config(model_dir, world, rows, response, prompt, "sharded"), rank=rank, world_size=world)
    batch = make_batch(rows, prompt, response)
    mine = batch[balanced_split(batch["response_mask"].sum(-1).numpy(), world)[rank]]
    if load_from is not None:
        t0 = time.perf_counter()
        w.load_checkpoint(load_from)
        out["load_s"] = time.perf_counter() - t0
    # a first update creates the gradients (and, fresh, the AdamW state): the one measured is the next
    m = w.update_actor(mine, step=1 if load_from is None else 3)
    out["metrics"] = {k: m[k] for k in ("actor/entropy", "actor/grad_norm", "actor/pg_loss")}  # resumed: step 3
    with RssPeak() as update:
        w.update_actor(mine, step=2 if load_from is None else 4)
    out["memory"] = {
        "parameters": _bytes(w.model.parameters()) / GB,
        "gradients": _bytes(p.grad for p in w.model.parameters() if p.grad is not None) / GB,
        "optimizer": _bytes(v for st in w.optimizer.state.values() for v in st.values() if v.dim()) / GB,
        "rollout copy": _bytes(w.gen_model.parameters()) / GB if w.gen_model is not w.model else 0.0,
        "update above its start": update.added,
    }
    if save is not None:
        directory = Path(work) / f"n{world}_{save}"
        directory.mkdir(parents=True, exist_ok=True)
        w.cfg.actor.checkpoint_format = save
        if world > 1:
            dist.barrier()
        with RssPeak() as saving:
            t0 = time.perf_counter()
            w.save_checkpoint(str(directory))
            if world > 1:
                dist.barrier()
            seconds = time.perf_counter() - t0
        out["save"] = {
            "s": seconds,
            "gb_written": _written(directory, rank, save == "sharded") / GB,
            "rss_added_gb": saving.added,
        }
        m = w.update_actor(mine, step=3)  # the run that was not interrupted: its next update
        out["next"] = {k: m[k] for k in ("actor/entropy", "actor/grad_norm")}
    out["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
    return out


def run(world: int, model_dir: Path, work: Path, args: dict, load_from: str | None, save: str | None) -> list[dict]:
    """``_rank`` on ``world`` ranks; a rank killed (out of memory) is reported as such, not raised."""
    from armor_core.testing import run_ranks

    out = work / f"ranks_n{world}_{save or 'load'}"
    out.mkdir(parents=True, exist_ok=True)
    fn = functools.partial(_rank, model_dir=str(model_dir), work=str(work), args=args, load_from=load_from, save=save)
    try:
        return run_ranks(fn, world, out)
    except AssertionError as e:
        print(f"N = {world}, {save or 'resume'}: {str(e).splitlines()[0]}", flush=True)
        return [{"failed": str(e).splitlines()[0]}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rows", type=int, default=4, help="rows in the batch (split over the ranks)")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--response", type=int, default=96)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    a = p.parse_args()
    args = {"rows": a.rows, "prompt": a.prompt, "response": a.response}
    work = Path(tempfile.mkdtemp(prefix="armor-sharding-"))
    try:
        model_dir = work / "model"
        n_params = build_model(a.shape, model_dir)
        print(
            f"model: Qwen2 with {a.shape} shapes, {n_params / 1e6:.0f}M parameters (float32 {n_params * 4 / GB:.2f} GB)"
        )
        # N = 2 writes the sharded checkpoint the others resume; the full form is saved last, apart: at these
        # shapes gathering it can exhaust the machine's memory, which then kills a rank
        results: dict = {2: run(2, model_dir, work, args, None, save="sharded")}
        for world in a.ranks:
            if world != 2:
                results[world] = run(world, model_dir, work, args, str(work / "n2_sharded"), save=None)
        results["2 full"] = run(2, model_dir, work, args, None, save="full")
        report(results, a.ranks, args)
        if a.out:
            Path(a.out).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict, ranks: list[int], args: dict) -> None:
    base = None
    print(
        f"\nbatch: {args['rows']} rows of {args['prompt']} + {args['response']} tokens, split over the ranks\n\n"
        "| N | parameters | gradients | AdamW state | rollout copy | update above its start | sum (GB) | x N=1 | "
        "process peak RSS (GB) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for world in ranks:
        if "failed" in results[world][0]:
            print(f"| {world} | {results[world][0]['failed']} |||||||")
            continue
        worst = max(results[world], key=lambda r: sum(r["memory"].values()))
        mem = worst["memory"]
        total = sum(mem.values())
        base = base or (total if world == 1 else None)
        ratio = f"{total / base:.2f}" if base else "-"
        peak = max(r["max_rss_gb"] for r in results[world])
        print(
            f"| {world} | {mem['parameters']:.2f} | {mem['gradients']:.2f} | {mem['optimizer']:.2f} | "
            f"{mem['rollout copy']:.2f} | {mem['update above its start']:.2f} | {total:.2f} | {ratio} | {peak:.2f} |"
        )
    print(
        "\n| checkpoint at N = 2 | save (s) | GB written, rank 0 / rank 1 | RSS added by the save, rank 0 / rank 1 (GB) |"
    )
    print("|---|---:|---:|---:|")
    for fmt, rows in (("sharded", results[2]), ("full", results["2 full"])):
        if "failed" in rows[0]:
            print(f"| {fmt} | {rows[0]['failed']} |||")
            continue
        s = [r["save"] for r in rows]
        print(
            f"| {fmt} | {max(x['s'] for x in s):.1f} | {s[0]['gb_written']:.2f} / {s[1]['gb_written']:.2f} | "
            f"{s[0]['rss_added_gb']:.2f} / {s[1]['rss_added_gb']:.2f} |"
        )
    print(
        "\n| resume of N = 2's sharded checkpoint | load (s) | next update's entropy, rel. diff | grad norm, rel. diff |"
    )
    print("|---|---:|---:|---:|")
    if "failed" in results[2][0]:
        return
    ref = results[2][0]["next"]
    for world in ranks:
        if world == 2 or "failed" in results[world][0]:
            continue
        got = results[world][0]["metrics"]
        de = abs(got["actor/entropy"] - ref["actor/entropy"]) / abs(ref["actor/entropy"])
        dg = abs(got["actor/grad_norm"] - ref["actor/grad_norm"]) / abs(ref["actor/grad_norm"])
        load_s = max(x["load_s"] for x in results[world])
        print(f"| 2 -> {world} | {load_s:.1f} | {de:.1e} | {dg:.1e} |")


if __name__ == "__main__":
    main()
