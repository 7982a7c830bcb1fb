"""Loss aggregation: hand-computed values, and the same loss and gradients whole, in micro-batches and across DP
ranks."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.distributed as dist

from armor_core.testing import run_ranks
from armor_plugins.losses.aggregation import AGGREGATIONS, count_tokens_and_seqs

MODES = sorted(AGGREGATIONS)
NORM = 8.0  # the constant C of seq-mean-token-sum-norm


def call(mode, loss_mat, mask, **counts):
    return AGGREGATIONS[mode](
        loss_mat, mask, norm_constant=NORM, **{"global_num_tokens": None, "global_num_seqs": None, **counts}
    )


# -- hand-computed ------------------------------------------------------------------------------


def test_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # row 2 is fully masked: not a sequence
    got = {
        mode: float(AGGREGATIONS[mode](loss, mask, global_num_tokens=None, global_num_seqs=None, norm_constant=4.0))
        for mode in MODES
    }
    assert got == {
        "token-mean": pytest.approx((1 + 2 + 3 + 4) / 4),
        "seq-mean-token-sum": pytest.approx((6 + 4) / 2),
        "seq-mean-token-mean": pytest.approx((2 + 4) / 2),
        "seq-mean-token-sum-norm": pytest.approx((6 / 4 + 4 / 4) / 2),
        "token-sum": pytest.approx(1 + 2 + 3 + 4),
    }


def test_global_counts_divide_instead_of_local_ones():
    loss = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert float(
        AGGREGATIONS["token-mean"](loss, mask, global_num_tokens=12, global_num_seqs=None, norm_constant=None)
    ) == pytest.approx(0.5)
    assert float(
        AGGREGATIONS["seq-mean-token-mean"](
            loss, mask, global_num_tokens=None, global_num_seqs=torch.tensor(4), norm_constant=None
        )
    ) == pytest.approx(0.5)
    # norm_constant None falls back to the padded length
    assert float(
        AGGREGATIONS["seq-mean-token-sum-norm"](
            loss, mask, global_num_tokens=None, global_num_seqs=2, norm_constant=None
        )
    ) == pytest.approx(6 / 3 / 2)


def test_empty_batch_is_zero_not_nan_and_bad_constants_are_errors():
    for mode in MODES:
        out = call(mode, torch.ones(2, 3, requires_grad=True), torch.zeros(2, 3))
        assert float(out.detach()) == 0.0
    with pytest.raises(ValueError, match="norm_constant=0.0 must be > 0"):
        AGGREGATIONS["seq-mean-token-sum-norm"](
            torch.ones(1, 1), torch.ones(1, 1), global_num_tokens=None, global_num_seqs=None, norm_constant=0.0
        )


def test_every_mode_resolves_through_the_plugin_manager(pm):  # conftest.py: the built-in algorithms only
    assert pm.names("loss_aggregation") == MODES
    loss, mask = torch.tensor([[2.0, 4.0]]), torch.ones(1, 2)
    assert (
        float(
            pm.get("loss_aggregation", "token-mean").fn(
                loss, mask, global_num_tokens=None, global_num_seqs=None, norm_constant=None
            )
        )
        == 3.0
    )


# -- equivalence: whole batch == micro-batches == DP ranks ------------------------------------------


def make_batch(seed=0, bs=10, T=6, dim=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, T, dim, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 0, 3, 6, 2, 5, 0, 4, 1])[:bs]  # uneven, with fully masked rows
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    theta = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64)
    return x, mask, theta


def per_token_loss(x, theta):
    # nonlinear in theta so gradients differ per token; NaN in padding would be caught by the mask
    return torch.tanh(x @ theta) ** 2 + 0.1 * (x @ theta)


def full_batch(mode, x, mask, theta):
    th = theta.clone().requires_grad_(True)
    loss = call(mode, per_token_loss(x, th), mask)
    loss.backward()
    return loss.detach(), th.grad


def split_rows(n, sizes):
    out, start = [], 0
    for s in sizes:
        out.append(slice(start, start + s))
        start += s
    assert start == n
    return out


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_sum_to_the_whole_batch(mode):
    x, mask, theta = make_batch()
    want_loss, want_grad = full_batch(mode, x, mask, theta)
    n_tok, n_seq = count_tokens_and_seqs(mask)
    assert (int(n_tok), int(n_seq)) == (28, 8)
    for sizes in ([10], [5, 5], [1, 3, 2, 4], [1] * 10):
        th = theta.clone().requires_grad_(True)
        total = torch.zeros((), dtype=torch.float64)
        for sl in split_rows(10, sizes):
            mb = call(mode, per_token_loss(x[sl], th), mask[sl], global_num_tokens=n_tok, global_num_seqs=n_seq)
            mb.backward()  # gradient accumulation, one backward per micro-batch
            total += mb.detach()
        torch.testing.assert_close(total, want_loss)
        torch.testing.assert_close(th.grad, want_grad)


@pytest.mark.parametrize("mode", MODES)
def test_simulated_data_parallel_ranks_match_the_whole_batch(mode):
    x, mask, theta = make_batch()
    want_loss, want_grad = full_batch(mode, x, mask, theta)
    world = 2
    shards = [slice(0, 3), slice(3, 10)]  # unequal shards: the ranks see different token counts
    n_tok = sum(count_tokens_and_seqs(mask[s])[0] for s in shards)  # what all_reduce(SUM) gives
    n_seq = sum(count_tokens_and_seqs(mask[s])[1] for s in shards)
    grads, losses = [], []
    for shard, micro in zip(shards, ([2, 1], [3, 3, 1])):
        th = theta.clone().requires_grad_(True)
        xs, ms = x[shard], mask[shard]
        rank_loss = torch.zeros((), dtype=torch.float64)
        for sl in split_rows(xs.shape[0], micro):
            # the worker multiplies by the world size to undo DDP's gradient averaging
            mb = world * call(mode, per_token_loss(xs[sl], th), ms[sl], global_num_tokens=n_tok, global_num_seqs=n_seq)
            mb.backward()
            rank_loss += mb.detach()
        grads.append(th.grad)
        losses.append(rank_loss)
    torch.testing.assert_close(sum(grads) / world, want_grad)  # DDP's all-reduce mean
    torch.testing.assert_close(sum(losses) / world, want_loss)


def test_averaging_local_means_would_not_be_exact():
    # the test above has teeth: per-micro-batch token means, averaged, weight tokens unevenly
    x, mask, theta = make_batch()
    want_loss, _ = full_batch("token-mean", x, mask, theta)
    naive = sum(call("token-mean", per_token_loss(x[sl], theta), mask[sl]) for sl in split_rows(10, [1, 3, 2, 4])) / 4
    assert abs(float(naive) - float(want_loss)) > 1e-3


# -- a real 2-process gloo DDP run ----------------------------------------------------------------


def _ddp_worker(rank, world, x, mask, theta):
    torch.set_num_threads(1)
    model = torch.nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(theta.unsqueeze(0))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    shard = [slice(0, 3), slice(3, 10)][rank]
    micro = [[2, 1], [3, 3, 1]][rank]
    xs, ms = x[shard], mask[shard]
    counts = torch.stack(count_tokens_and_seqs(ms))
    dist.all_reduce(counts)  # SUM over ranks: the global counts of the mini-batch
    results = {}
    for mode in MODES:
        model.zero_grad()
        slices = split_rows(xs.shape[0], micro)
        for i, sl in enumerate(slices):
            last = i == len(slices) - 1
            # accumulate locally; all-reduce once, on the last micro-batch (forward included, as DDP requires)
            with contextlib.nullcontext() if last else ddp.no_sync():
                z = ddp(xs[sl]).squeeze(-1)
                loss_mat = torch.tanh(z) ** 2 + 0.1 * z
                loss = world * call(mode, loss_mat, ms[sl], global_num_tokens=counts[0], global_num_seqs=counts[1])
                loss.backward()
        results[mode] = model.weight.grad.detach().clone().squeeze(0)
    return results


@pytest.mark.slow
def test_real_gloo_ddp_gradients_match_the_whole_batch(tmp_path):
    x, mask, theta = make_batch()
    # run_ranks: one gloo group of 2 processes whose ranks leave together (a rank exiting right after the
    # last collective can abort its peer)
    for rank, got in enumerate(run_ranks(functools.partial(_ddp_worker, x=x, mask=mask, theta=theta), 2, tmp_path)):
        for mode in MODES:
            _, want_grad = full_batch(mode, x, mask, theta)
            torch.testing.assert_close(
                got[mode], want_grad, msg=lambda m, mode=mode, rank=rank: f"{mode} rank {rank}: {m}"
            )
