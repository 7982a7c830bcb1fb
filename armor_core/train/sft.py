"""Small supervised fine-tuning (``armor sft``, whose arguments ``armor_core.cli.sft`` parses), the way the built-in
warm start was made.

RL on a verifiable reward needs a policy that already succeeds sometimes: with zero successes in
a group every GRPO advantage is zero and nothing is learned. ``armor sft`` gives a model that
start. It trains a causal LM on (prompt, response) pairs with the loss on response tokens only
(prompt tokens are context, not targets), evaluates greedy exact-match accuracy on held-out
prompts as it goes, and writes a Hugging Face directory (safetensors + tokenizer) that
``armor run model.path=DIR`` and vLLM load as is.

``--stop-at-accuracy`` ends training at the first evaluation that reaches the given held-out
accuracy. That is how ``builtin:arithmetic-tiny`` is deliberately made *half* trained (about 50%):
an RL recipe then has room to show what it adds. The exact command is in that model's README.md.

Simplifications, on purpose: one process, no gradient accumulation, AdamW with linear warm-up then
a constant learning rate, full-batch padding to the longest row of each batch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armor_core.train.jsonl import json_lines
from armor_core.train.sft_traces import build_chat_char_tokenizer, encode_traces, trace_accuracy
from armor_core.train.steps import batch_indices, eval_due, evaluating, optimizer_step, pad_encoded
from armor_core.workers.actor.schedule import lr_factor

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "evaluate_greedy",
    "fresh_char_model",
    "load_pairs",
    "response_only_loss",
    "run_sft",
    "task_pairs",
]

#: characters always in a fresh char-level vocabulary, so a model made for ``+`` problems still
#: tokenises ``-`` and ``*`` prompts (as known, untrained tokens) instead of mapping them to <unk>
BASE_CHARS = "0123456789+-*= "
#: ``--init tiny-qwen2``: hidden 128, 4 layers of 4 heads (head_dim 32), MLP 512 -> ~1.05M parameters
TINY_QWEN2 = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512)
# ``armor sft --init`` choices: the architecture ``build_tiny_model`` builds at TINY_QWEN2's dimensions
TINY_ARCHS = {"tiny-qwen2": "qwen2", "tiny-deepseek-v3": "deepseek_v3"}


# -- data -----------------------------------------------------------------------------------------


def load_pairs(path: str | Path) -> list[dict[str, str]]:
    """Rows ``{"prompt", "response", "ground_truth"}`` from a JSONL file of {prompt, response|ground_truth}.

    ``response`` is the training target: the row's ``response``, or else ``str(ground_truth)``.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--data file {str(p)!r} is a directory; give a JSONL file")
    if not p.is_file():
        raise ValueError(f"--data file {str(p)!r} does not exist")
    rows = []
    for lineno, raw in json_lines(p):
        if not isinstance(raw, dict) or not isinstance(raw.get("prompt"), str):
            raise ValueError(f"{p}, line {lineno}: expected an object with a text field 'prompt'")
        target = raw.get("response", raw.get("ground_truth"))
        if target is None:
            raise ValueError(f"{p}, line {lineno}: needs a 'response' (the target text) or a 'ground_truth'")
        gt = raw.get("ground_truth", target)
        rows.append({"prompt": raw["prompt"], "response": str(target), "ground_truth": str(gt)})
    if not rows:
        raise ValueError(f"{p}: no rows")
    return rows


def task_pairs(task: str, split: str, size: int, seed: int, params: dict[str, Any]) -> list[dict[str, str]]:
    from armor_core.plugins import get_plugin_manager

    fn = get_plugin_manager().get("task", task, where="--task").fn
    # a row's own ``response`` is the target where the ground truth is not one (code: tests, not a program)
    return [
        {
            "prompt": r["prompt"],
            "response": str(r.get("response", r["ground_truth"])),
            "ground_truth": str(r["ground_truth"]),
        }
        for r in fn(split, size, seed, **params)
    ]


def fresh_char_model(rows: list[dict[str, Any]], seed: int, arch: str = "qwen2") -> tuple[PreTrainedModel, Any]:
    """``--init tiny-qwen2`` (or ``tiny-deepseek-v3``: ``arch``): a fresh char-level tiny model of ``TINY_QWEN2``'s
    dimensions and its tokenizer, whose vocabulary covers ``rows`` (and ``BASE_CHARS``); for traces, a chat tokenizer
    with roles and tool-call tags."""
    from armor_core.models.loading import build_char_tokenizer, build_tiny_model

    if rows and "messages" in rows[0]:  # traces: a chat template, roles and tool-call tags
        tokenizer = build_chat_char_tokenizer(m["content"] for r in rows for m in r["messages"])
    else:
        tokenizer = build_char_tokenizer(set(BASE_CHARS).union(*(set(r["prompt"]) | set(r["response"]) for r in rows)))
    return build_tiny_model(arch, len(tokenizer), seed=seed, **TINY_QWEN2), tokenizer


# -- training -------------------------------------------------------------------------------------


def response_only_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over response tokens.

    :param logits: (bs, T, vocab) from the model on ``input_ids``.
    :param input_ids: (bs, T) prompt + response + EOS, right-padded.
    :param loss_mask: (bs, T) 1 on tokens that are targets (response and its EOS), 0 on prompt and padding.
    :returns: 0-d tensor: sum over masked targets of -log p(token | prefix) / number of targets.
    """
    import torch.nn.functional as F

    # position t predicts token t+1
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = loss_mask[:, 1:].to(nll.dtype)
    return (nll * mask).sum() / mask.sum().clamp(min=1.0)


def _encode_pairs(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]]) -> list[tuple[list[int], Any]]:
    """Each row as (prompt ids + response ids + EOS, number of prompt tokens), or a trace as (ids, loss mask)."""
    if rows and "messages" in rows[0]:
        return encode_traces(tokenizer, rows)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; the model must learn to stop")
    out = []
    for r in rows:
        p = tokenizer(r["prompt"])["input_ids"]
        resp = tokenizer(r["response"], add_special_tokens=False)["input_ids"]
        out.append((list(p) + list(resp) + [eos], len(p)))
    return out


def evaluate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, str]],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    passed: Any = None,
) -> float:
    """Greedy exact-match accuracy: the decoded response, stripped, equals ``row["ground_truth"]``; for
    traces, the teacher-forced share reproduced token for token (``sft_traces.trace_accuracy``)."""
    if rows and "messages" in rows[0]:
        return trace_accuracy(model, tokenizer, rows, batch_size)

    from armor_core.models.loading import encode_prompts

    correct = 0
    with evaluating(model):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            ids, mask, _, kept = encode_prompts(
                tokenizer, [r["prompt"] for r in chunk], max_length=10**9, truncation="left"
            )
            # a causal LM's generate (GenerationMixin), which the PreTrainedModel annotation lacks
            out = model.generate(  # pyright: ignore[reportCallIssue]
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
            if passed is not None:  # e.g. a reward domain's verdict (sft_reward.reward_passed)
                correct += sum(passed([chunk[k] for k in kept], list(texts)))
                continue
            correct += sum(t.strip() == chunk[k]["ground_truth"].strip() for k, t in zip(kept, texts))
    return correct / max(len(rows), 1)


def run_sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: list[dict[str, str]],
    val_rows: list[dict[str, str]],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 20,
    lr_schedule: str = "constant",
    weight_decay: float = 0.0,
    eval_every: int = 50,
    stop_at_accuracy: float | None = None,
    max_new_tokens: int = 8,
    seed: int = 1,
    log: Any = print,
    passed: Any = None,
) -> dict[str, Any]:
    """Train ``model`` in place; returns ``{"steps", "val_accuracy", "history": [(step, loss, acc)], "seconds"}``.

    Batches are drawn without replacement from a seeded permutation of ``train_rows``, reshuffled
    each epoch. Evaluation runs every ``eval_every`` steps and after the last step.
    """
    import torch

    from armor_core.models.loading import padding_id

    _check_rows(train_rows, val_rows)
    encoded = _encode_pairs(tokenizer, train_rows)
    pad_id = padding_id(tokenizer)
    batches = batch_indices(len(encoded), batch_size, torch.Generator().manual_seed(seed))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(warmup_steps, lr_schedule, steps))
    history: list[tuple[int, float, float | None]] = []
    acc = evaluate_greedy(model, tokenizer, val_rows, max_new_tokens=max_new_tokens, passed=passed)
    log(f"step 0: held-out greedy accuracy {acc:.3f} on {len(val_rows)} rows")
    t0 = time.perf_counter()
    model.train()
    step, loss_sum, loss_n = 0, 0.0, 0
    while step < steps:
        loss = _train_step(model, opt, sched, pad_encoded([encoded[i] for i in next(batches)], pad_id), step + 1)
        step += 1
        loss_sum, loss_n = loss_sum + loss, loss_n + 1
        if eval_due(step, eval_every, steps):
            acc = evaluate_greedy(model, tokenizer, val_rows, max_new_tokens=max_new_tokens, passed=passed)
            mean_loss = loss_sum / loss_n
            history.append((step, mean_loss, acc))
            log(
                f"step {step}/{steps}: loss {mean_loss:.4f}  held-out greedy accuracy {acc:.3f}  lr "
                f"{sched.get_last_lr()[0]:.2e}  {time.perf_counter() - t0:.1f}s"
            )
            loss_sum, loss_n = 0.0, 0
            if stop_at_accuracy is not None and acc >= stop_at_accuracy:
                log(f"held-out accuracy {acc:.3f} >= --stop-at-accuracy {stop_at_accuracy}: stopping at step {step}")
                break
    model.eval()
    return {"steps": step, "val_accuracy": acc, "history": history, "seconds": time.perf_counter() - t0}


def _check_rows(train_rows: list[dict[str, Any]], val_rows: list[dict[str, Any]]) -> None:
    if not train_rows:
        raise ValueError("no training rows")
    if not val_rows:
        raise ValueError(
            "no held-out rows to measure accuracy on: give --val-data, or at least 10 rows in --data (a tenth is "
            "held out)"
        )


def _train_step(
    model: PreTrainedModel,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    batch: tuple[torch.Tensor, ...],
    step: int,
) -> float:
    """One optimizer step on a collated ``batch`` (``steps.optimizer_step``); returns its loss.

    :raises FloatingPointError: the loss is not finite, naming ``step`` (1-based).
    """
    input_ids, attention, loss_mask = batch
    logits = model(input_ids=input_ids, attention_mask=attention).logits
    loss = response_only_loss(logits, input_ids, loss_mask)
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"armor sft: loss is {loss.item()} at step {step}; lower --lr")
    optimizer_step(loss, opt, model.parameters(), sched)
    return loss.item()
