"""How fast a DataProto travels to a Ray actor and back, against a plain dict of torch tensors,
and over a worker group's direct channel (``armor_core/engine/channel.py``).

    python benchmarks/dataproto_transfer.py [--rows 256] [--seq 2048] [--runs 20] [--idle-ms 0]

The batch is what a rollout step moves: int64 ``input_ids``, float32 ``log_probs`` and a bool
``mask`` of shape (rows, seq), plus one string per row. Each "ray" variant is sent to an actor
whose method returns its argument, so the time covers serialise -> object store -> deserialise,
twice. Variants take turns (after a warm-up) and the table shows each one's median. The
"pickle" rows do the same round trip in this process, as Ray's serializer does it (protocol 5,
large buffers out of band and handed back read-only), which isolates the serialisation cost.
The "slice" rows send the first eighth of the batch: torch pickles a view's whole storage,
DataProto only the viewed rows. "payload MB" is what protocol-5 pickling produces.

With RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1, Ray uses its own opt-in tensor serializer for the
dict rows (it leaves received tensors read-only and warns that writing to them is undefined;
DataProto copies them instead); the payload column does not reflect that serializer.

The "channel" rows make the same round trip through a one-worker ``WorkerGroup``'s direct socket.
``--idle-ms`` has the worker sleep that long before it answers, as a training step computes between
calls; the sleep is taken out of the times shown. Between steps the threads that carry a call have
gone idle and must be woken, which is what makes a Ray call costlier there than back to back.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from armor_core import DataProto


def make_batch(rows: int, seq: int) -> tuple[DataProto, dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 150_000, (rows, seq), generator=gen),
        "log_probs": -torch.rand(rows, seq, generator=gen) * 5,
        "mask": torch.rand(rows, seq, generator=gen) > 0.1,
    }
    prompts = [
        f"Question {i}: what is {i} * 17 + {i % 7}? Think step by step and answer with a number." for i in range(rows)
    ]
    data = DataProto.from_dict(
        tensors=tensors, non_tensors={"prompt": np.array(prompts, dtype=object)}, meta_info={"step": 1}
    )
    return data, {**tensors, "prompt": prompts}


def payload_bytes(obj: Any) -> int:
    """Bytes a protocol-5 pickler produces: the in-band stream plus every out-of-band buffer."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(stream) + sum(memoryview(b).nbytes for b in buffers)


def median_ms(fns: dict[str, Callable[[], Any]], runs: int, warmup: int) -> dict[str, float]:
    """Median wall time per function; the functions take turns so that a burst of load elsewhere
    on the machine hits every variant alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def pickle_round_trip(obj: Any) -> Any:
    """What Ray's serializer does, in one process: protocol 5, large buffers passed out of band."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    # Ray's buffers come back read-only (shared memory); bytes() gives the same here
    return pickle.loads(stream, buffers=[memoryview(bytes(b)) for b in buffers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--idle-ms",
        type=float,
        default=0.0,
        help="the worker sleeps this long before answering (taken out of the times)",
    )
    args = parser.parse_args()
    idle_s = args.idle_ms / 1000

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)

    from armor_core.engine import WorkerGroup

    class Echo:
        def __init__(self, rank: int = 0, world_size: int = 1) -> None:
            pass

        def ping(self) -> dict:
            return {}

        def echo(self, obj: Any, idle_s: float = 0.0) -> Any:
            time.sleep(idle_s)
            return obj

    actor = ray.remote(num_cpus=0)(Echo).remote()
    ray.get(actor.echo.remote(None))  # the actor process is up before anything is timed
    group = WorkerGroup(Echo, 1, cpus_per_worker=0.01, gpus_per_worker=0, name="echo", init_kwargs={})  # channel on

    data, plain = make_batch(args.rows, args.seq)
    part = args.rows // 8
    plain_slice = {k: v[:part] for k, v in plain.items()}
    cases = [
        ("nothing (Ray call overhead)", "ray", None),
        ("nothing (channel overhead)", "channel", None),
        ("DataProto", "ray", data),
        ("DataProto", "channel", data),
        ("dict of torch tensors", "ray", plain),
        (f"DataProto[:{part}] (slice)", "ray", data[:part]),
        (f"dict of tensor[:{part}] views", "ray", plain_slice),
        ("DataProto", "pickle", data),
        ("dict of torch tensors", "pickle", plain),
    ]
    fns = {}
    for name, path, obj in cases:
        if path == "ray":
            fns[name, path] = lambda obj=obj: ray.get(actor.echo.remote(obj, idle_s))
        elif path == "channel":
            fns[name, path] = lambda obj=obj: group.call(Echo.echo, obj, idle_s)
        else:
            fns[name, path] = lambda obj=obj: pickle_round_trip(obj)
    medians = median_ms(fns, args.runs, args.warmup)
    print(
        f"batch {args.rows} x {args.seq}: int64 input_ids + float32 log_probs + bool mask + {args.rows} strings; "
        f"median of {args.runs} runs after {args.warmup} warm-up; the worker idles {args.idle_ms:g} ms before "
        "answering (not counted)"
    )
    print(f"{'variant':30} {'path':7} {'payload MB':>10} {'round trip ms':>14} {'MB/s':>7}")
    for name, path, obj in cases:
        remote = path in ("ray", "channel")
        ms, mb = medians[name, path] - (args.idle_ms if remote else 0.0), payload_bytes(obj) / 1e6
        # a remote round trip moves the payload twice (there and back), a pickle round trip once
        moved = 2 * mb if remote else mb
        print(f"{name:30} {path:7} {mb:10.2f} {ms:14.2f} {moved / (ms / 1000):7.0f}")
    group.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
