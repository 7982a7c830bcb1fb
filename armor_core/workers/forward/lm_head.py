"""Response log-probs and entropy from the last hidden states, without a (tokens, vocabulary) tensor.

The plain way (``common.response_log_probs``) takes the model's logits, (rows, R, V), and
log-softmaxes them. With a 152k-token vocabulary that tensor is 0.6 GB per 1,000 tokens in float32,
and autograd keeps about five of its size alive (logits, their temperature-scaled copy, softmax,
softmax x logits, the logits' gradient): 4 x 4096 tokens would need ~50 GB before the model.

Here the LM head runs in chunks of ``chunk`` tokens. Forward keeps, per token, only its log-prob,
``log Z`` and the entropy; backward recomputes each chunk's logits from the saved
hidden states and applies the closed-form gradient (``z`` = logits / temperature, ``p`` = softmax(z),
``y`` = the sampled token)::

    d log p_y / dz = onehot(y) - p
    d H / dz       = -p * (log p + H)             (H = -sum p log p)

so neither pass holds more than a (chunk, V) block or two. A position may ask for several targets
(the sampled token and, for distillation, a teacher's top-k ids): their log-probs come from the same
block, and the gradient of ``sum_j g_j log p_j`` is ``sum_j g_j onehot(t_j) - (sum_j g_j) p``.
The matmuls run in the compute dtype (the autocast dtype under autocast, else the hidden states'
dtype); softmax, log-probs, entropy and gradient accumulation for the head's weight run in float32.

The head must run inside the model's own forward: DDP finds the parameters a backward will reduce
there, and FSDP2 gathers the head's sharded weight only around the root module's forward. So the
model's ``nn.Linear`` head becomes a :class:`ResponseHead` (same parameters, same state-dict names),
which is a plain linear layer until a caller asks, through :func:`response_head_request`, for
log-probs of given positions and targets; the model then returns them where it returned logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

__all__ = [
    "HeadRequest",
    "ResponseHead",
    "chunked_log_probs",
    "install_response_head",
    "response_head_of",
    "response_head_request",
]


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _scaled_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """(n, V) float32 logits / temperature of one chunk; the matmul runs in ``weight``'s dtype."""
    z = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()
    return z.div_(temperature) if temperature != 1.0 else z


class _ChunkedLogProbs(torch.autograd.Function):
    """(hidden (N, H), weight (V, H), bias (V,) | None, targets (N, m)) -> log-prob (N, m), entropy (N,)."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        targets,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        compute_dtype: torch.dtype,
    ):
        n, m = targets.shape  # m targets per position (the sampled token, then any others asked for)
        w = weight.to(compute_dtype)  # a no-op unless autocast asks for a lower precision than the master weights
        b = bias.to(compute_dtype) if bias is not None else None
        log_prob = torch.empty(n, m, dtype=torch.float32, device=hidden.device)
        log_z = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros_like(log_z)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                z = _scaled_logits(hidden[s:e], w, b, temperature)
                lz = torch.logsumexp(z, dim=-1)
                log_z[s:e] = lz
                log_p = z.sub_(lz[:, None])
                log_prob[s:e] = log_p.gather(-1, targets[s:e])
                if with_entropy:
                    # -sum p log p: every term >= 0, so no cancellation (log Z - E_p[z] loses digits when
                    # the distribution is peaked); einsum is a batched dot, no third (n, V) tensor
                    entropy[s:e] = torch.einsum("nv,nv->n", log_p.exp(), log_p).neg_()
                del z, log_p
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, entropy if with_entropy else None)
        ctx.temperature, ctx.chunk, ctx.compute_dtype = temperature, chunk, compute_dtype
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        t, chunk, cd = ctx.temperature, ctx.chunk, ctx.compute_dtype
        w = weight.to(cd)
        b = bias.to(cd) if bias is not None else None
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        grad_b = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
            if bias is not None and ctx.needs_input_grad[2]
            else None
        )
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                e = min(s + chunk, hidden.shape[0])
                g_lp = grad_lp[s:e].float()  # (n, m): d/dz of sum_j g_j log p(t_j) is g_j onehot(t_j) - sum_j g_j p
                g_sum = g_lp.sum(-1, keepdim=True)
                log_p = _scaled_logits(hidden[s:e], w, b, t).sub_(log_z[s:e, None])
                p = log_p.exp()
                if (
                    entropy is not None
                ):  # dz = g_lp onehot - g_sum p - g_ent p (log p + H) = g_lp onehot - p (g_sum + g_ent (log p + H))
                    dz = p.mul_(log_p.add_(entropy[s:e, None]).mul_(grad_ent[s:e, None].float()).add_(g_sum)).neg_()
                else:
                    dz = p.mul_(-g_sum)
                del log_p
                dz.scatter_add_(-1, targets[s:e], g_lp)
                if t != 1.0:
                    dz.div_(t)
                dz_c = dz.to(cd)
                if grad_hidden is not None:
                    grad_hidden[s:e] = (dz_c @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.add_(dz_c.t() @ hidden[s:e].to(cd))
                if grad_b is not None:
                    grad_b.add_(dz.sum(0))
                del dz, dz_c
        return (
            grad_hidden,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None and bias is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` and the entropy under ``softmax((hidden @ weight.T + bias) / temperature)``.

    :param hidden: (N, H), the hidden states that predict each target.
    :param weight: (V, H), the LM head's weight; ``bias``: (V,) or None.
    :param targets: (N,) int64 token ids, or (N, m): m targets at each position (one head pass for all).
    :param temperature: the sampling temperature (0 or 1: none), as in ``common.response_log_probs``.
    :param chunk: tokens per block through the head (> 0); memory is about two (chunk, V) float32 blocks.
    :returns: ``(log_prob, entropy)``, float32: log_prob shaped as ``targets``, entropy (N,), None unless
        ``with_entropy``.
        Differentiable in ``hidden``, ``weight`` and ``bias``.
    """
    if chunk < 1:
        raise ValueError(f"chunked_log_probs: chunk={chunk} must be >= 1 token")
    cd = _autocast_dtype(hidden.device.type) or hidden.dtype
    t = float(temperature) if temperature and temperature != 1.0 else 1.0
    many = targets.long().reshape(targets.shape[0], -1)
    lp, ent = _ChunkedLogProbs.apply(hidden, weight, bias, many, t, int(chunk), with_entropy, cd)
    return lp.view(targets.shape), (ent if with_entropy else None)


@dataclass(frozen=True)
class HeadRequest:
    """What a :class:`ResponseHead` computes instead of logits: for the flat positions ``index``
    into the (rows x sequence) hidden states, the log-prob of ``targets`` ((N,), or (N, m): m targets per
    position) and, with ``with_entropy``, the entropy, in blocks of ``chunk`` tokens."""

    index: torch.Tensor
    targets: torch.Tensor
    temperature: float
    chunk: int
    with_entropy: bool


class ResponseHead(torch.nn.Linear):
    """An LM head that is a plain ``nn.Linear`` until :func:`response_head_request` is active; then
    its output is a (1, N, m + 1) float32 tensor: the requested log-probs of the m targets at each position
    (m = 1 for (N,) targets), then the entropy (0 without)."""

    request: HeadRequest | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        req = self.request
        if req is None:
            return super().forward(hidden)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, req.index.to(hidden.device))
        lp, ent = chunked_log_probs(
            h, self.weight, self.bias, req.targets.to(hidden.device), req.temperature, req.chunk, req.with_entropy
        )
        lp = lp.reshape(lp.shape[0], -1)
        ent = ent if ent is not None else torch.zeros(lp.shape[0], dtype=lp.dtype, device=lp.device)
        return torch.cat([lp, ent[:, None]], dim=-1).unsqueeze(0)


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "module", module)  # DDP keeps the model in .module


def response_head_of(module: torch.nn.Module) -> ResponseHead | None:
    """The model's :class:`ResponseHead`, if :func:`install_response_head` gave it one."""
    get = getattr(_unwrapped(module), "get_output_embeddings", None)
    head = get() if get is not None else None
    return head if isinstance(head, ResponseHead) else None


@contextmanager
def response_head_request(module: torch.nn.Module, request: HeadRequest) -> Iterator[None]:
    """Within this block, ``module``'s forward returns ``request``'s log-probs where it returned logits."""
    head = response_head_of(module)
    if head is None:
        raise RuntimeError(
            f"{type(_unwrapped(module)).__name__} has no ResponseHead; call install_response_head(model) first"
        )
    head.request = request
    try:
        yield
    finally:
        head.request = None


@torch.no_grad()
def install_response_head(model: torch.nn.Module) -> str | None:
    """Give ``model`` a :class:`ResponseHead` (in place: the same module object and parameters, so
    tied embeddings stay tied and checkpoints keep their names), if its logits are exactly its
    head's linear map of the last hidden states. Checked on a 6-token input: a model that scales,
    soft-caps or otherwise changes its logits after the head would get wrong log-probs.

    Call it before DDP or FSDP2 wraps the model (the check runs a forward).
    :returns: None when installed, else why not (the caller keeps the plain path).
    """
    get_head = getattr(model, "get_output_embeddings", None)  # a transformers model's, not torch.nn.Module's
    head = get_head() if callable(get_head) else None
    if type(head) is not torch.nn.Linear:
        return f"its output layer is {type(head).__name__}, not a torch.nn.Linear"
    device = head.weight.device
    ids = torch.arange(6, device=device).remainder(head.out_features).unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        expected = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)[0]
        head.__class__ = ResponseHead
        targets = ids[0].flip(0)
        with response_head_request(model, HeadRequest(torch.arange(6, device=device), targets, 1.0, 4, False)):
            got = model(input_ids=ids, use_cache=False).logits[0, :, 0]
    finally:
        model.train(was_training)
    want = expected.gather(-1, targets[:, None]).squeeze(-1)
    tolerance = 1e-4 if head.weight.dtype == torch.float32 else 5e-2
    if got.shape != want.shape or not torch.allclose(got, want, atol=tolerance, rtol=0):
        head.__class__ = torch.nn.Linear
        diff = float((got - want).abs().max()) if got.shape == want.shape else "shape"
        return (
            f"{type(model).__name__}'s logits are not its head's linear map of the last hidden states "
            f"(log-prob difference {diff})"
        )
    return None
