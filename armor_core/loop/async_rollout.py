"""Asynchronous rollout (``rollout.mode=async``): rollout workers of their own generate ahead while
the actor trains, on weights at most ``rollout.max_staleness`` updates old.

The driver keeps ``max_staleness + 1`` batches in flight on the rollout group. At the start of step
``j`` (the actor has made ``j - 1`` updates) it sends the rollout workers the newest weights, if
they have not had them, then enough new batches to fill the queue again, and takes the oldest. Ray
runs a worker's calls in the order they were sent, so a batch sent before a weight push is
generated with the older weights: the batch trained on at step ``j`` was sent ``max_staleness``
steps earlier, on the weights after update ``j - 1 - max_staleness``, while step ``j - 1``'s update
and the generation overlapped. Each row carries its ``policy_version``; ``rollout/staleness_mean``
and ``_max`` over the rows a step trains on are logged (``RolloutSource.collect``), and a batch
older than the bound is an error (it cannot happen unless the queue logic is broken).

Off-policy rows are corrected in the loss by ``algorithm.rollout_correction`` (importance weights
between the rollout's log-probs and the trained policy's), and the ``rollout_mismatch`` guard sees
the gap (``rollout/logprob_diff_*``) as it does for a colocated engine.

Weights: at the end of each update the actor ranks copy the policy's plain state dict (a LoRA
policy merged; gathered under FSDP2) to CPU (``perf/publish_s``). The driver asks rank 0 for that
copy through Ray (``ActorWorker.policy_state``), which puts it in Ray's object store while the
actor goes on with its next update (the copy is never written again), and every rollout worker
loads it from there (``RolloutWorker.set_weights``, ``perf/rollout_weights_load_s``): one copy per
node, nothing through the driver, and the driver only sends two calls (``timing_s/update_weights``).

Checkpoints: the driver waits for the batches in flight, and the checkpoint keeps them
(``async_queue/``: prompts and generated rows as DataProto files, the rollout workers' RNG states
behind them, the data position after them), so ``--resume`` trains on exactly the rows the
interrupted run would have (bit for bit with the ``hf`` backend; a vLLM engine's sampler state is
not saved). A checkpoint without them (written before this, or rows that are not JSON) keeps the
data position of the oldest batch in flight, and the resumed run regenerates the queue from the
restored weights instead of skipping its prompts. A rollback always drops the queue: its rows came
from weights that were taken back.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armor_core.ops.sample_seeds import SEED_KEY
from armor_core.workers.api import ActorAPI, RolloutAPI

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto
    from armor_core.engine import Pending, WorkerGroup
    from armor_core.loop.data import PromptLoader

__all__ = ["AsyncRollout"]

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def generation_request(gen_in: DataProto, multi_turn: bool) -> DataProto:
    """What a generation call sends: the prompts' tensors (with their per-sample seeds when they have them) and, for
    multi-turn rollouts, the rows' columns too (each episode's environment is built from its row)."""
    keys = [*PROMPT_KEYS, *([SEED_KEY] if SEED_KEY in gen_in.tensors else [])]
    return gen_in.select(tensor_keys=keys, non_tensor_keys=list(gen_in.non_tensors) if multi_turn else None)


def environment_metrics(rollout_metrics: dict) -> dict[str, float]:
    """The ``env/...`` metrics a multi-turn rollout reports (turns, tool calls, episodes ended by each limit)."""
    return {k: v for k, v in rollout_metrics.items() if k.startswith("env/")}


QUEUE_DIR = "async_queue"  # inside a checkpoint directory


@dataclass
class _InFlight:
    gen_in: DataProto  # the prompts, repeated rollout.n times, with their non-tensor columns
    pending: Pending | None  # the rollout group's generate call (None once ``out`` is known)
    loader_state: dict  # the loader's position before these prompts were taken
    out: DataProto | None = None  # the generated rows, once gathered

    def result(self) -> DataProto:
        if self.out is None:
            assert self.pending is not None, "an in-flight batch holds its call or its rows"
            rows: DataProto = self.pending.result()
            self.out, self.pending = rows, None
        return self.out


class AsyncRollout:
    """The rollout worker group and the queue of batches it is generating."""

    def __init__(
        self,
        group: WorkerGroup,
        actor: WorkerGroup,
        loader: PromptLoader,
        n: int,
        max_staleness: int,
        multi_turn: bool = False,
    ) -> None:
        self.group, self.actor, self.loader, self.n, self.max_staleness = group, actor, loader, n, max_staleness
        self.multi_turn = multi_turn
        self.queue: deque[_InFlight] = deque()
        self.pushed: int | None = None  # the version the rollout workers were last sent

    def push(self, version: int) -> float:
        """Send the policy after ``version`` updates to the rollout workers (once per version);
        returns the seconds it took the driver (sending two calls: the copy moves beside training)."""
        if self.pushed == version:
            return 0.0
        t0 = time.perf_counter()
        state = self.actor.call_rank(0, ActorAPI.policy_state)  # the copy rank 0 made at the end of its last update
        self.group.submit_call(RolloutAPI.set_weights, state, version)  # queued behind the batches already sent
        self.pushed = version
        return time.perf_counter() - t0

    def next(self, version: int) -> tuple[DataProto, DataProto]:
        """The oldest batch in flight, for the step after ``version`` updates: ``(gen_in, out)``.
        Tops the queue up to ``max_staleness + 1`` batches first, on the newest weights."""
        while len(self.queue) < self.max_staleness + 1:
            state = self.loader.state_dict()
            gen_in = self.loader.next_samples(self.n)
            request = generation_request(gen_in, self.multi_turn)
            self.queue.append(_InFlight(gen_in, self.group.submit(RolloutAPI.generate, request), state))
        item = self.queue.popleft()
        out = item.result()
        staleness = version - out["policy_version"]
        if int(staleness.max()) > self.max_staleness:
            raise RuntimeError(
                f"async rollout: a batch generated by the policy after update {int(out['policy_version'].min())} "
                f"reached the update after {version}, beyond rollout.max_staleness={self.max_staleness}; this is a "
                "bug in the queue, please report it"
            )
        return item.gen_in, out

    def generate(self, prompts: DataProto, version: int, **kwargs: Any) -> DataProto:
        """Generate now with the policy after ``version`` updates (validation), behind the batches in flight."""
        self.push(version)
        return self.group.dispatch(RolloutAPI.generate, prompts, **kwargs)

    def loader_state(self) -> dict:
        """The data position a checkpoint keeps: before the oldest batch in flight (they are regenerated on resume)."""
        return self.queue[0].loader_state if self.queue else self.loader.state_dict()

    def drop(self) -> None:
        """Forget the batches in flight and what the workers hold (after a rollback: the weights and data position went
        back)."""
        self.queue.clear()
        self.pushed = None

    def save(self, directory: Path) -> None:
        """Write the batches in flight into the checkpoint being written at ``directory`` (waiting
        for their generation), with the rollout workers' RNG states behind them and the data position
        after them. Rows that JSON cannot hold are not written: the resume regenerates them."""
        from armor_core.storage.state_io import save_state

        if not self.queue:
            return
        rng = self.group.call(RolloutAPI.rng_state)  # Ray runs it after the generations sent before it
        target = Path(directory) / QUEUE_DIR
        target.mkdir()
        try:
            for k, item in enumerate(self.queue):
                item.gen_in.save(target / f"{k}_prompts.safetensors")
                item.result().save(target / f"{k}_rows.safetensors")
        except (TypeError, ValueError) as e:  # a ground truth or extra that is not JSON
            shutil.rmtree(target)
            warnings.warn(
                f"async rollout: the batches in flight are not saved with the checkpoint ({e}); a resume "
                "regenerates them",
                stacklevel=2,
            )
            return
        save_state(
            {
                "loader_states": [item.loader_state for item in self.queue],
                "loader_after": self.loader.state_dict(),
                "rng": rng,
            },
            target / "queue",
        )

    def restore(self, directory: Path, allow_legacy_pt: bool = False) -> bool:
        """Put the batches a checkpoint saved back in flight, as they were; False when it holds none
        (or not for this many rollout workers and ``max_staleness``): the queue is then regenerated.
        ``allow_legacy_pt``: an older checkpoint's ``queue.pt`` may be read (``trainer.allow_legacy_pt_state``)."""
        from armor_core.dataproto.protocol import DataProto
        from armor_core.storage.state_io import load_checkpoint_state

        target = Path(directory) / QUEUE_DIR
        state = load_checkpoint_state(target / "queue", missing_ok=True, allow_legacy_pt=allow_legacy_pt)
        if state is None or len(state["rng"]) != self.group.n or len(state["loader_states"]) > self.max_staleness + 1:
            return False
        self.queue = deque(
            _InFlight(
                DataProto.load(target / f"{k}_prompts.safetensors"),
                None,
                loader_state,
                DataProto.load(target / f"{k}_rows.safetensors"),
            )
            for k, loader_state in enumerate(state["loader_states"])
        )
        self.loader.load_state_dict(state["loader_after"])
        for rank, rng in enumerate(state["rng"]):
            self.group.call_rank(rank, RolloutAPI.set_rng_state, rng)
        self.pushed = None
        return True
