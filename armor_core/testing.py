"""Helpers for plugin authors' tests.

Register a plugin for the duration of a test, without installing anything, and check an
implementation against the contract the trainer relies on::

    from armor_core import hookimpl
    from armor_core.testing import registered, check_advantage_estimator

    class MyPlugin:
        @hookimpl
        def armor_register_advantage_estimators(self, register):
            register("centered", compute_centered_advantage)

    def test_centered():
        with registered(MyPlugin()) as pm:
            est = pm.get("advantage_estimator", "centered")
            check_advantage_estimator(est)

Inside ``registered`` the plugin is visible everywhere ARMOR looks plugins up in this process
(``get_plugin``, config validation, ``armor plugins`` run in-process); afterwards it is gone, so the
suite never depends on what happened to be installed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from armor_core import plugins as _plugins
from armor_core.interfaces import AdvantageEstimator, PolicyLoss, RewardDomain, RewardResult, call_with_params

__all__ = ["check_advantage_estimator", "check_policy_loss", "check_reward_domain", "isolated_plugin_manager", "left_padded_batch", "registered",
           "rollout_batch", "run_ranks", "shared_prompt_batch"]


@contextlib.contextmanager
def registered(*plugin_objects: Any, load_entrypoints: bool = True) -> Iterator[_plugins.PluginManager]:
    """Make ``plugin_objects`` visible to the process-wide plugin manager for the ``with`` block.

    :param load_entrypoints: also keep the installed plugins (False gives a manager with only yours).
    """
    saved = _plugins._default
    pm = _plugins.PluginManager(load_entrypoints=load_entrypoints)
    for obj in plugin_objects:
        pm.register(obj)
    _plugins._default = pm
    try:
        yield pm
    finally:
        _plugins._default = saved


@contextlib.contextmanager
def isolated_plugin_manager() -> Iterator[_plugins.PluginManager]:
    """A process-wide manager with no plugins at all; register yours with ``pm.register``."""
    with registered(load_entrypoints=False) as pm:
        yield pm


def _toy_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bs, t = 8, 5
    mask = torch.ones(bs, t)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    mask[7] = 0  # a fully masked row
    rewards = torch.zeros(bs, t)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.0])  # groups: {0,1} {2,3} {4,5,6} {7}
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    rewards[last] = scores[last.any(-1)]
    index = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    values = torch.randn(bs, t, generator=g) * mask
    return {"token_level_rewards": rewards, "response_mask": mask, "index": index, "values": values}


def check_advantage_estimator(estimator: AdvantageEstimator, **params: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``estimator`` on a small batch with awkward rows and check the trainer's contract.

    Checks: both outputs have the input's shape, are finite, and are zero outside the response
    mask (including a fully masked row). Returns ``(advantages, returns)`` for further asserts.
    """
    b = _toy_batch()
    available = {"values": b["values"], "gamma": 1.0, "lam": 1.0, "epsilon": 1e-6, "norm_adv_by_std": True}
    adv, ret = call_with_params(estimator.fn, b["token_level_rewards"], b["response_mask"], b["index"], available=available, extra=params)
    for name, out in (("advantages", adv), ("returns", ret)):
        assert out.shape == b["response_mask"].shape, f"{name} has shape {tuple(out.shape)}, expected {tuple(b['response_mask'].shape)}"
        assert torch.isfinite(out).all(), f"{name} has non-finite values: {out}"
        assert (out[b["response_mask"] == 0] == 0).all(), f"{name} is non-zero outside the response mask: {out}"
    return adv, ret


def check_policy_loss(loss: PolicyLoss, **params: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run ``loss`` on extreme log-ratios and check shape, finiteness, masking and a finite gradient."""
    b = _toy_batch()
    mask = b["response_mask"]
    log_prob = (torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * 50).requires_grad_(True)
    old_log_prob = torch.full(mask.shape, -1000.0)
    adv = torch.linspace(-3, 3, mask.numel()).reshape(mask.shape) * mask
    available = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    loss_mat, metrics = call_with_params(loss.fn, log_prob, old_log_prob, adv, mask, available=available, extra=params)
    assert loss_mat.shape == mask.shape, f"loss_mat has shape {tuple(loss_mat.shape)}, expected {tuple(mask.shape)}"
    assert torch.isfinite(loss_mat).all(), f"loss is not finite for log-ratios near 1000: {loss_mat}"
    assert (loss_mat[mask == 0] == 0).all(), "loss is non-zero outside the response mask"
    loss_mat.sum().backward()
    assert log_prob.grad is not None and torch.isfinite(log_prob.grad).all(), "gradient is missing or not finite"
    assert isinstance(metrics, dict)
    return loss_mat, metrics


def check_reward_domain(domain: RewardDomain, cases: list[tuple[str, str, Any, float]], extra: dict | None = None) -> None:
    """Score ``(prompt, response, ground_truth, expected_score)`` cases and compare (to 1e-6)."""
    for prompt, response, gt, expected in cases:
        out = domain(prompt, response, gt, extra or {})
        assert isinstance(out, RewardResult)
        assert abs(out.score - expected) < 1e-6, f"{domain.fn.__name__}({prompt!r}, {response!r}, {gt!r}) = {out.score}, expected {expected}"


def _rank_entry(rank: int, fn: Any, world: int, port: int, out_dir: str) -> None:
    import os
    import traceback

    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.save(fn(rank, world), os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Any, world: int, out_dir: str | Any) -> list[Any]:
    """Run ``fn(rank, world)`` in ``world`` processes joined in one gloo group; return each rank's result.

    ``fn`` must be importable (a module-level function); its results travel through ``torch.save``
    files in ``out_dir``. A failing rank's traceback is raised here as an AssertionError, so a
    data-parallel test reads like a single-process one::

        def _step(rank, world):
            worker = ActorWorker(config, rank=rank, world_size=world)
            return worker.update_actor(share[rank], step=1)

        metrics = run_ranks(_step, 2, tmp_path)
    """
    import socket
    from pathlib import Path

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(out_dir)
    try:
        mp.spawn(_rank_entry, args=(fn, world, port, str(out)), nprocs=world, join=True)
    except Exception:
        raise AssertionError("a rank failed:\n" + "\n".join(p.read_text() for p in sorted(out.glob("rank*.err")))) from None
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def left_padded_batch(ids: list[list[int]], pad: int = 0) -> Any:
    """A rollout backend's input: the token-id rows left-padded with ``pad`` to one width, with
    ``attention_mask`` and ``position_ids`` (0 on padding), a ``uid`` per row and a ``meta_info``
    entry that a backend must carry over."""
    from armor_core.protocol import DataProto

    width = max(len(r) for r in ids)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
                               non_tensors={"uid": [f"p{i}" for i in range(len(ids))]}, meta_info={"note": "kept"})


def rollout_batch(prompt_lens: list[int], resp_lens: list[int], P: int = 6, R: int = 5, vocab: int = 23, seed: int = 0,
                  pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random batch laid out like the rollout's output: prompts left-padded to ``P`` tokens, then
    responses right-padded to ``R``. Returns ``(input_ids, attention_mask, position_ids, responses)``;
    positions after a short response keep counting, as the rollout writes them."""
    g = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    ids = torch.randint(3, vocab, (bs, P + R), generator=g)
    attn = torch.zeros(bs, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        attn[i, P - p : P] = 1
        attn[i, P : P + r] = 1
    ids = torch.where(attn.bool(), ids, torch.full_like(ids, pad))
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    pos[:, P:] = pos[:, P - 1 : P] + torch.arange(1, R + 1)
    return ids, attn, pos, ids[:, P:].clone()


def shared_prompt_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A :func:`rollout_batch` of 12 rows where four prompts repeat 2-4 times each, in shuffled
    order (as GRPO's groups after a shuffle), with responses of mixed lengths, one of them empty."""
    prompt_of = [0, 1, 0, 2, 3, 1, 0, 2, 3, 3, 0, 1]
    prompt_lens = [6, 3, 1, 5]
    resp_lens = [5, 1, 3, 0, 5, 2, 4, 5, 1, 3, 2, 4]
    ids, attn, pos, resp = rollout_batch([prompt_lens[g] for g in prompt_of], resp_lens, seed=seed)
    first = {g: prompt_of.index(g) for g in set(prompt_of)}
    for i, g in enumerate(prompt_of):
        ids[i, :6] = ids[first[g], :6]
    return ids, attn, pos, resp
