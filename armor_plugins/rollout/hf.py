"""The ``hf`` rollout backend: sampling with a transformers causal LM, in the worker's own process.

It runs its own decoding loop over the model's forward with a KV cache instead of calling
``model.generate``: the loop is a few lines, and owning it means the log-probability recorded
for each token is exactly the one of the distribution it was drawn from, and that none of
``generate``'s defaults (``generation_config.top_k = 50``, repetition penalties, ...) slips in.

Log-probs: ``rollout_log_probs`` is ``log_softmax(logits / T)`` of the sampled token, *before*
top-k / top-p truncation, with ``T`` the sampling temperature (1 when it is 0). That is the
distribution the actor recomputes (``armor_core.workers.forward.layouts.response_log_probs`` divides by
the same temperature), so on-policy the PPO ratio starts at 1 up to float noise. With top-k or
top-p < 1 the tokens were actually drawn from the renormalised truncated distribution; the
untruncated log-prob is what vLLM reports too. Greedy decoding records the same quantity for the
argmax token.

Randomness comes from torch's global generator (the trainer seeds it), so a seeded run samples
the same tokens again on the same hardware. Since rows that have finished stop drawing (below),
a seed gives other tokens than it did before this backend dropped finished rows; the
distribution they are drawn from is the same.

Two savings matter on RL batches, where each prompt is repeated ``n`` times and most responses
end well before ``max_new_tokens``. Shared prefill: rows with the same prompt (tokens, mask and
positions, in any order) go through the prompt pass once, and its KV cache and last logits are
copied to each of them; with ``n = 8`` the prompt pass costs an eighth. Compaction: once a
quarter of the decoding batch has finished, the finished rows' cache, mask and positions are
dropped, so later steps compute only live rows. Both select cache rows with
``Cache.reorder_cache`` (beam search's selection, an ``index_select``: 2-3x faster on CPU than
the advanced indexing of ``batch_select_indices``); a model whose cache has no such method gets
every row prefilled and kept to the end. Neither changes what a row computes, beyond the float
noise of another batch size, so greedy decoding gives the same tokens.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch
import torch.nn.functional as F

from armor_core import hookimpl
from armor_core.errors import NonFiniteError
from armor_core.hookspecs import RegisterRolloutBackend
from armor_core.models.moe import is_moe
from armor_core.models.routing_replay import ROUTES, RouteGrid, RouteRecorder, check_replayable
from armor_core.models.weight_sums import HeldSum, plain_name, weight_sum
from armor_core.ops.sample_seeds import SEED_KEY, uniform
from armor_core.ops.sampling_replay import KeptRecord, kept_outputs, kept_set, truncate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from armor_core.dataproto import DataProto
from armor_plugins.rollout.common import Sampling, assemble_output, eos_ids, prepare_prompts, resolve_sampling

__all__ = ["HFRollout", "sample_next_token"]

# finished rows leave the decoding batch once this share of it has finished. Selecting the live
# rows of the cache costs about what one decoding step saves on 5-7 rows; measured on
# builtin:arithmetic-tiny, 16 prompts x 8, 2 CPU cores: 0.1-0.3 equally fast, 0.05 and 0.4 slower
_COMPACT_AT = 0.25


def sample_next_token(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    keep: bool = False,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Choose one token per row and return it with the log-prob it was drawn with.

    :param logits: (bs, vocab) next-token logits.
    :param keep: also return the kept set (sampling-mask replay, ``armor_core.ops.sampling_replay``).
    :param uniforms: (bs,) one uniform in [0, 1) per row (per-sample seeds, ``armor_core.ops.sample_seeds``): each
        row's token is drawn by inverse CDF from its own, not from torch's global generator.
    :returns: ``tokens`` (bs,) int64, ``log_probs`` (bs,) float32 and ``kept``. ``log_probs`` is the log-prob
        of the distribution the token was drawn from: ``log_softmax(logits / T)`` (T = 1 when temperature is 0),
        restricted to the top-k / top-p set and renormalised when sampling truncates. ``kept`` is None when
        nothing was truncated, else ``(ids (bs, K) int32 -1 padded, log_mass (bs,))`` (ids empty unless ``keep``).
    """
    logits = logits.float()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    logp = F.log_softmax(scaled, dim=-1)
    kept = None
    if greedy or temperature <= 0:
        tokens = logits.argmax(dim=-1)
    else:
        vocab = scaled.shape[-1]
        if 0 < top_k < vocab or top_p < 1.0:
            scaled = truncate(scaled, top_k, top_p)
            if keep:
                kept = kept_set(scaled, logp)
            else:
                log_mass = torch.logsumexp(logp.masked_fill(~torch.isfinite(scaled), float("-inf")), dim=-1)
                kept = (torch.empty((len(scaled), 0), dtype=torch.int32, device=scaled.device), log_mass)
        probs = scaled.softmax(dim=-1) if kept is not None else logp.exp()  # untruncated: the softmax is at hand
        try:
            tokens = (
                torch.multinomial(probs, num_samples=1).squeeze(-1)
                if uniforms is None
                else _inverse_cdf(probs, uniforms)
            )
        except RuntimeError:  # checked only on failure: a check per token would cost every step
            if bool(torch.isfinite(probs).all()):
                raise
            raise NonFiniteError(
                "the policy's next-token distribution holds NaN or inf (its logits are not finite: the weights "
                "diverged); the StabilityGuard's non_finite guard (guard.enable=true, on by default) skips or rolls "
                "back such updates before they reach sampling"
            ) from None
    lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, (lp - kept[1] if kept is not None else lp), kept


def _drawer(sp: Sampling) -> Any:
    """``sample_next_token`` with the sampling settings ``sp`` bound: ``draw(logits, uniforms=...)``."""
    return functools.partial(
        sample_next_token, greedy=sp.greedy, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, keep=sp.keep
    )


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token of each row whose cumulative probability first exceeds the row's uniform (in float64: a sum rounded
    in float32 could pass a zero-probability token's edge)."""
    cdf = probs.double().cumsum(-1)
    if not bool(torch.isfinite(cdf[:, -1]).all()):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")
    tokens = torch.searchsorted(cdf, (uniforms.to(cdf.device) * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    # a uniform at the very top, rounded, can land past the last token with mass: take the last one that has any
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).long().argmax(-1)
    return torch.minimum(tokens, last)


class HFRollout:
    """Rollout backend ``hf``: ``HFRollout(model, tokenizer, config: RolloutConfig)``.

    ``model`` may be the actor's own module (colocated: weight updates are then already visible
    and ``update_weights`` copies nothing) or a separate copy (``update_weights`` loads into it).
    """

    shares_module = True  # generates by running the module it is given: a LoRA actor hands over its peft model
    # > 1: the module is sharded over this many ranks (FSDP2) and each forward is a collective, so every rank runs
    # as many as the others (``_agree``); the actor sets it on its instance when it generates from its shards
    lockstep = 1
    separate_worker = True  # runs in a rollout worker of its own (rollout.mode=async)

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.eos_token_ids = eos_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        # only the last position's logits are used: transformers' causal LMs can skip the rest,
        # which in the prompt pass of a large-vocabulary model is most of the memory
        get_base = getattr(model, "get_base_model", None)  # a peft model passes keywords through
        base = get_base() if get_base is not None else model
        accepts = inspect.signature(base.forward).parameters
        self._forward_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        self._cache_selects: bool | None = None  # can this model's cache select batch rows? known after a forward
        if getattr(config, "backend_kwargs", None):
            raise ValueError(
                f"rollout.backend_kwargs={dict(config.backend_kwargs)!r}: the hf backend takes no extra arguments"
            )
        # routing replay: the experts each forward chose, kept per position (``armor_core.models.routing_replay``)
        self._recorder = RouteRecorder(model) if getattr(config, "routing_replay", False) and is_moe(model) else None
        if self._recorder is not None:
            check_replayable(model)
        self._routed: torch.Tensor | None = None  # the last forward's routes while recording

    # -- generation -----------------------------------------------------------------------------

    def generate(self, prompts: DataProto, **overrides: Any) -> DataProto:
        """Sample responses for left-padded prompts.

        :param prompts: DataProto with ``input_ids``, ``attention_mask`` and optionally
            ``position_ids``, each (bs, P).
        :param overrides: ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``, ``greedy``
            (argmax decoding), ``do_sample`` (False means greedy), ``n`` (samples per prompt,
            rows repeated interleaved: a, a, b, b).
        :returns: DataProto (bs * n rows) with ``prompts`` (bs, P); ``responses`` (bs, R),
            R = max_new_tokens, right-padded with the pad id; ``response_mask`` (bs, R), 1 up to
            and including the EOS token; ``input_ids``, ``attention_mask``, ``position_ids``
            (bs, P + R) of the whole sequence; ``rollout_log_probs`` (bs, R), 0 outside the
            mask. Non-tensor columns and meta_info are carried over.
        """
        sp = resolve_sampling("HFRollout", self.config, overrides)
        cfg, max_new = self.config, sp.max_new
        prompts, input_ids, attention_mask, position_ids = prepare_prompts("HFRollout", prompts, sp.n)
        out_device = input_ids.device
        device = next(self.model.parameters()).device
        pieces = []
        was_training = self.model.training
        self.model.eval()
        recording = self._recorder.recording() if self._recorder is not None else contextlib.nullcontext()
        try:
            with torch.no_grad(), recording:
                starts = list(range(0, input_ids.shape[0], cfg.micro_batch_size))
                # in lockstep a rank with fewer micro-batches runs stand-ins (one row, discarded) as the others run
                for i in range(self._agree(len(starts))):
                    sl = slice(starts[i], starts[i] + cfg.micro_batch_size) if i < len(starts) else None
                    ids, mask, pos = (
                        (input_ids[sl], attention_mask[sl], position_ids[sl]) if sl else self._stand_in(input_ids)
                    )
                    seeds = prompts[SEED_KEY][sl] if sl is not None and SEED_KEY in prompts else None
                    piece = self._generate_micro_batch(
                        ids.to(device), mask.to(device), pos.to(device), sp, seeds, stand_in=sl is None
                    )
                    if sl is not None:
                        pieces.append(piece)
        finally:
            self.model.train(was_training)
        if pieces:
            responses, response_mask, log_probs = (torch.cat([p[i] for p in pieces]).to(out_device) for i in range(3))
        else:
            responses = torch.zeros((0, max_new), dtype=torch.long, device=out_device)
            response_mask, log_probs = torch.zeros_like(responses), torch.zeros((0, max_new), device=out_device)
        extra = kept_outputs([p[3] for p in pieces], max_new) if pieces and pieces[0][3] is not None else None
        if pieces and pieces[0][4] is not None:
            extra = {**(extra or {}), ROUTES: torch.cat([p[4] for p in pieces])}
        return assemble_output(
            prompts, input_ids, attention_mask, position_ids, responses, response_mask, log_probs, extra
        )

    def _agree(self, n: int) -> int:
        """The largest ``n`` over the ranks in lockstep; ``n`` itself with one rank."""
        if self.lockstep == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def _stand_in(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prompt of a pad token, for a micro-batch this rank runs only to keep in step."""
        ids = torch.full((1, 1), self.pad_token_id, dtype=input_ids.dtype)
        return ids, torch.ones_like(ids), torch.zeros_like(ids)

    def _generate_micro_batch(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        sp: Sampling,
        seeds: torch.Tensor | None = None,
        stand_in: bool = False,
    ) -> tuple[Any, ...]:
        """(responses, response_mask, log_probs), each (b, max_new), for one micro-batch on the model's device; when
        sampling truncated, (kept ids (b, max_new, K) int32, -1 padded, or None; kept mass (b, max_new)), else None;
        with routing replay the routes (b, P + max_new, MoE layers, top_k) int16 (``RouteGrid``), else None."""
        b, device, max_new = ids.shape[0], ids.device, sp.max_new
        draw = _drawer(sp)
        # left padding shared by every row is dropped: masked positions change nothing but cost compute
        real_cols = (mask != 0).any(dim=0).nonzero()
        first = int(real_cols[0]) if len(real_cols) else 0
        ids, mask, pos = ids[:, first:], mask[:, first:].long(), pos[:, first:]
        prompt_len = ids.shape[1]
        responses = torch.full((b, max_new), self.pad_token_id, dtype=torch.long, device=device)
        resp_mask = torch.zeros((b, max_new), dtype=torch.long, device=device)
        log_probs = torch.zeros((b, max_new), dtype=torch.float32, device=device)
        # every step's mask is a prefix of this one, so it is never grown by concatenation
        attn = torch.cat([mask, torch.ones((b, max_new), dtype=mask.dtype, device=device)], dim=1)
        next_pos = pos[:, -1:] + 1

        past, logits = self._shared_prefill(ids, mask, pos)
        routes = RouteGrid(self._routed, max_new) if self._routed is not None else None
        can_select = self._cache_selects
        # a lookup table costs one indexing op per step; torch.isin costs several
        is_eos = torch.zeros(max(logits.shape[-1], max(self.eos_token_ids) + 1), dtype=torch.bool, device=device)
        is_eos[self.eos_token_ids] = True
        rows = torch.arange(b, device=device)  # the output row of each row of the decoding batch
        live = torch.ones(b, dtype=torch.bool, device=device)
        # a stand-in (lockstep) samples nothing: its forwards only keep this rank in step, and draw no random numbers
        n_live = 0 if stand_in else b
        tokens = torch.full((b,), self.pad_token_id, dtype=torch.long, device=device)
        kept_record = KeptRecord(b, max_new, device)
        for t in range(max_new):
            if n_live:  # in lockstep a finished rank decodes on without sampling (no draw, nothing recorded)
                draws = uniform(seeds[rows.cpu()], t) if seeds is not None and not sp.greedy else None
                tokens, lp, kept = draw(logits, uniforms=draws)
                tokens = torch.where(live, tokens, self.pad_token_id)
                responses[rows, t] = tokens
                resp_mask[rows, t] = live.long()
                log_probs[rows, t] = torch.where(live, lp, 0.0)
                kept_record.add(rows, t, live, kept)
                live = live & ~is_eos[tokens]
                n_live = int(live.sum())
            if self._agree(n_live) == 0 or t == max_new - 1:  # done here, and (in lockstep) on every rank
                break
            if can_select and n_live and len(rows) - n_live >= max(1.0, _COMPACT_AT * len(rows)):
                keep = live.nonzero().squeeze(-1)
                past.reorder_cache(keep)
                rows, live, tokens, attn, next_pos = rows[keep], live[keep], tokens[keep], attn[keep], next_pos[keep]
            past, logits = self._forward(tokens.unsqueeze(-1), attn[:, : prompt_len + t + 1], next_pos + t, past)
            if routes is not None and self._routed is not None:
                routes.step(rows, t, self._routed)
        routed = routes.result(first) if routes is not None and not stand_in else None
        return responses, resp_mask, log_probs, kept_record.result(sp.keep), routed

    def _shared_prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The prompt pass, run once per distinct prompt, its cache and last logits copied to every row.

        :param ids, mask, pos: (b, P) prompt tokens, attention mask and positions, rows in any order.
        :returns: ``(past_key_values, logits)`` with logits (b, vocab), both in the rows' order. A
            model whose cache cannot select batch rows gets every row.
        """
        # a row is another's prompt when tokens, mask and positions all agree (positions may be given); in lockstep
        # not before the cache is known to select rows: one that cannot would cost some ranks a second forward
        # (a cache that cannot select rows would have to be prefilled again, whole)
        if self._cache_selects is True or (self._cache_selects is None and self.lockstep == 1):
            distinct, inverse = torch.unique(torch.cat([ids, mask, pos], dim=1), dim=0, return_inverse=True)
            if len(distinct) < len(ids):
                p = ids.shape[1]
                past, logits = self._forward(distinct[:, :p], distinct[:, p : 2 * p], distinct[:, 2 * p :])
                if self._cache_selects:
                    past.reorder_cache(inverse)
                    if self._routed is not None:
                        self._routed = self._routed.index_select(0, inverse)
                    return past, logits.index_select(0, inverse)
        return self._forward(ids, mask, pos)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, past: Any = None
    ) -> tuple[Any, torch.Tensor]:
        """One cached forward: ``(past_key_values, logits of the last position (b, vocab))``."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=past,
            use_cache=True,
            **self._forward_kwargs,
        )
        if self._cache_selects is None:
            self._cache_selects = hasattr(out.past_key_values, "reorder_cache")
        if self._recorder is not None:  # built only for a model with routers
            self._routed = self._recorder.take(ids.shape[0])
        return out.past_key_values, out.logits[:, -1, :]

    # -- weights --------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the policy's new ``(name, tensor)`` pairs (e.g. ``actor.state_dict().items()``).

        Tensors that already are this model's own storage (a colocated actor sharing its module)
        are skipped, so colocated sync costs no copy. ``module.`` / ``_orig_mod.`` prefixes from
        DDP or torch.compile are stripped; an unknown name or a shape mismatch is an error.
        """
        own = self._own_tensors()
        with torch.no_grad():
            for name, tensor in named_tensors:
                key = plain_name(name)
                target = own.get(key)
                if target is None:
                    close = difflib.get_close_matches(key, list(own), n=1)
                    hint = f" Did you mean {close[0]!r}?" if close else ""
                    raise KeyError(
                        f"hf rollout update_weights: the rollout model has no parameter or buffer {name!r}.{hint}"
                    )
                if hasattr(tensor, "full_tensor"):  # a DTensor shard from FSDP2
                    tensor = tensor.full_tensor()  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(
                        f"hf rollout update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout model "
                        f"expects {tuple(target.shape)}"
                    )
                if tensor.data_ptr() == target.data_ptr() and tensor.device == target.device:
                    continue
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    def _own_tensors(self) -> dict[str, torch.Tensor]:
        """Every name this model's tensors go by: a tied ``lm_head.weight`` too, which ``named_parameters()``
        leaves out as the embedding's duplicate but a trainer's state dict (FSDP2's, gathered) names."""
        own: dict[str, torch.Tensor] = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(self.model.named_buffers(remove_duplicate=False))
        return own

    def weight_sums(self, names: Sequence[str]) -> dict[str, HeldSum]:
        """What this model holds under the trainer's tensor ``names``, one key per tensor
        (``armor_core.models.weight_sums``); a name it does not hold is left out."""
        own = self._own_tensors()
        out = {}
        for name in names:
            key = plain_name(name)
            if (t := own.get(key)) is not None:
                out[key] = HeldSum(weight_sum(t), t.dtype, (name,))
        return out


@hookimpl
def armor_register_rollout_backends(register: RegisterRolloutBackend) -> None:
    register("hf", HFRollout)
