"""preflight: a damaged or incomplete model directory, a tokenizer that does not load, and guard
parameters a guard refuses are errors naming the file or key, raised in the driver before any
worker starts."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from armor_core.config.schema import ConfigError, load_config
from armor_core.loop.preflight import check_guards, check_model, check_model_dir, check_safetensors, check_trainable
from armor_core.models.loading import ModelPathError, resolve_model_path

BUILTIN = "builtin:arithmetic-tiny"


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(resolve_model_path(BUILTIN), d)
    return d


def _truncate(f, keep):
    f.write_bytes(f.read_bytes()[:keep])


def _shard(d):
    """The model split as save_pretrained shards it: two files and an index naming them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, d / shard, metadata={"format": "pt"})
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: s for s, keys in halves.items() for k in keys}})
    )


DAMAGE = {
    "empty weights": (
        lambda d: (d / "model.safetensors").write_bytes(b""),
        r"model.safetensors has 0 bytes, fewer than a safetensors file's 8-byte header",
    ),
    "truncated header": (
        lambda d: _truncate(d / "model.safetensors", 100),
        r"model.safetensors: its header says the JSON header has \d+ bytes, but the file has 100",
    ),
    "truncated data": (
        lambda d: _truncate(d / "model.safetensors", 6000),
        r"model.safetensors: tensor '.*' ends at byte \d+ of the data, but the file holds only \d+ bytes",
    ),
    "garbage weights": (
        lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"),
        r"model.safetensors: the safetensors header is not valid JSON",
    ),
    "extra bytes": (
        lambda d: (d / "model.safetensors").open("ab").write(b"\x00" * 16),
        r"the tensors in its header cover \d+ bytes of data but the file holds \d+",
    ),
    "no weights": (
        lambda d: (d / "model.safetensors").unlink(),
        r"holds no weights \(model.safetensors or its shards\)",
    ),
    "missing config": (lambda d: (d / "config.json").unlink(), r"has no config.json"),
    "config not JSON": (
        lambda d: (d / "config.json").write_text("{model_type: qwen2"),
        r"config.json is not valid JSON \(Expecting property name",
    ),
    "config without model_type": (lambda d: (d / "config.json").write_text("{}"), r"config.json has no 'model_type'"),
    "missing shard": (
        lambda d: (_shard(d), (d / "model-00002-of-00002.safetensors").unlink()),
        r"model.safetensors.index.json names the shard 'model-00002-of-00002.safetensors', which is not in",
    ),
    "tokenizer not JSON": (lambda d: _truncate(d / "tokenizer.json", 50), r"tokenizer.json is not valid JSON"),
    "tokenizer unloadable": (
        lambda d: (d / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}'),
        r"the tokenizer in .* cannot be loaded: ",
    ),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), r"has no tokenizer"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_model_directory_is_an_error_naming_the_file(model_dir, damage):
    hurt, message = DAMAGE[damage]
    hurt(model_dir)
    with pytest.raises(ModelPathError, match=message) as e:
        check_model(str(model_dir))
    assert str(model_dir) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ("reward.model={path: '%s'}", "reward.model.path"),
        ("reward.judge=[{url: 'http://127.0.0.1:1/v1', template: x}, {model: '%s', template: x}]", "reward.judge[1].model"),
    ],
)  # fmt: skip
def test_a_damaged_reward_model_or_judge_is_refused_at_start_naming_its_key(model_dir, entry, key):
    from armor_core.loop.preflight import check_run

    _truncate(model_dir / "model.safetensors", 6000)
    with pytest.raises(ModelPathError, match=rf"^{re.escape(key)}={re.escape(str(model_dir))}: .*ends at byte") as e:
        check_run(load_config(None, [entry % model_dir]))  # what armor run and --dry-run check before any worker
    assert "\n" not in str(e.value)


def test_an_intact_model_passes_whole_or_sharded(model_dir):
    check_model(BUILTIN)
    check_model(str(model_dir))
    _shard(model_dir)
    check_model(str(model_dir))
    for shard in model_dir.glob("model-*.safetensors"):
        check_safetensors(shard)


def test_a_hub_name_is_refused_as_before_without_any_download():
    with pytest.raises(
        ModelPathError, match=r"model path 'Qwen/Qwen2.5-0.5B' does not exist; .* ARMOR never downloads models"
    ):
        check_model("Qwen/Qwen2.5-0.5B")


def test_a_lora_adapter_directory_is_checked_with_its_base(tmp_path, model_dir):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    shutil.copy(model_dir / "model.safetensors", adapter / "adapter_model.safetensors")  # any sound safetensors file
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(model_dir)}))
    assert check_model_dir(adapter) == adapter
    _truncate(model_dir / "model.safetensors", 100)
    with pytest.raises(ModelPathError, match=rf"{model_dir}/model.safetensors: its header says"):
        check_model_dir(adapter)


@pytest.mark.parametrize(
    "guards, message",
    [
        (
            "[{name: grad_spike, params: {window: 0}}]",
            r"^guard.guards\[0\]: guard grad_spike: parameter window=0 must be >= 1",
        ),
        (
            "[{name: non_finite}, {name: grad_spike, params: {windw: 3}}]",
            r"^guard.guards\[1\] \(grad_spike\): .*unexpected keyword argument 'windw'",
        ),
    ],
)
def test_guard_parameters_a_guard_refuses_are_config_errors(guards, message):
    with pytest.raises(ConfigError, match=message):
        check_guards(load_config(None, [f"guard.guards={guards}"]))
    check_guards(load_config(None, [f"guard.guards={guards}", "guard.enable=false"]))  # guards off: nothing is built


def test_a_model_with_a_non_finite_weight_is_refused_naming_the_tensor(model_dir):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_dir / "model.safetensors")
    name = sorted(tensors)[3]
    tensors[name].view(-1)[5] = float("nan")
    tensors[name].view(-1)[7] = float("inf")
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ModelPathError, match=rf"model.safetensors: tensor '{name}' holds 2 NaN or inf value\(s\) of \d+; a model"
    ):
        check_model(str(model_dir))


def test_armor_run_refuses_an_adapter_as_the_model(tmp_path, model_dir):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    shutil.copy(model_dir / "model.safetensors", adapter / "adapter_model.safetensors")
    shutil.copy(model_dir / "tokenizer.json", adapter / "tokenizer.json")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(model_dir)}))
    with pytest.raises(
        ModelPathError, match=rf"model.path={adapter} is a LoRA adapter .* Set model.path to its base \({model_dir}\)"
    ):
        check_trainable(load_config(None, [f"model.path={adapter}"]))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["model.lora_rank=100000"],
            r"model.lora_rank=100000 exceeds the width of the smallest targeted layer, model.layers.0.self_attn.q_proj "
            r"\(128 x 128\).* Set model.lora_rank <= 128",
        ),
        (
            ["model.lora_rank=4", "model.lora_target_modules=[q_proj,vproj]"],
            r"model.lora_target_modules: 'vproj' matches no module of Qwen2ForCausalLM; its linear layers are",
        ),
        (
            ["model.lora_rank=4", "model.lora_target_modules=[norm]"],
            r"'norm' is a Qwen2RMSNorm, a layer type LoRA \(peft\) cannot wrap",
        ),
    ],
)
def test_lora_targets_and_rank_are_checked_against_the_model_before_any_worker(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_trainable(load_config(None, overrides))


def test_lora_settings_that_fit_pass_and_full_fine_tuning_builds_nothing():
    check_trainable(load_config(None, ["model.lora_rank=128", "model.lora_target_modules=[q_proj,down_proj]"]))
    check_trainable(load_config(None, ["model.lora_rank=0", "model.lora_target_modules=[nothing]"]))


CALCULATOR = "armor_plugins.environments.builtin_tools:calculator"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["rollout.multi_turn.parser=hermez"],
            r"^rollout.multi_turn \(environment 'tools'\): unknown parser 'hermez'\. Did you mean 'hermes'\?",
        ),
        (
            [f"rollout.multi_turn.environment_kwargs={{tools: ['{CALCULATOR}'], timout_s: 3}}"],
            r"^rollout.multi_turn.environment_kwargs: unknown parameter 'timout_s' for ToolsEnvironment\. "
            r"Did you mean 'timeout_s'\?",
        ),
        (
            [f"rollout.multi_turn.environment_kwargs={{tools: ['{CALCULATOR.replace('tor', 'ter')}']}}"],
            r"tool 'armor_plugins.environments.builtin_tools:calculater': cannot import it .*"
            r"Did you mean 'calculator'\?",
        ),
        (
            ["rollout.multi_turn.environment_kwargs={tools: ['no_such_module_x:f']}"],
            r"tool 'no_such_module_x:f': cannot import it \(ModuleNotFoundError",
        ),
        (
            [f"rollout.multi_turn.environment_kwargs={{tools: '{CALCULATOR}'}}"],
            r"tools must be a list of 'module:function' names",
        ),
        (
            [f"rollout.multi_turn.environment_kwargs={{tools: ['{CALCULATOR}'], timeout_s: 0}}"],
            r"timeout_s=0 must be a finite number > 0",
        ),
        (["rollout.multi_turn.environment=toolz"], r"unknown environment 'toolz'.*Did you mean 'tools'\?"),
    ],
    ids=["parser", "unknown kwarg", "misspelt tool", "missing module", "tools a string", "timeout 0", "environment"],
)
def test_multi_turn_typos_are_config_errors_before_any_worker(overrides, message):
    from armor_core.loop.preflight import check_multi_turn
    from armor_core.plugins import PluginError

    on = ["rollout.multi_turn.enable=true", f"rollout.multi_turn.environment_kwargs={{tools: ['{CALCULATOR}']}}"]
    with pytest.raises((ConfigError, PluginError), match=message):
        check_multi_turn(load_config(None, [*on, *overrides]))
    check_multi_turn(load_config(None, on))  # the same environment, spelt right, passes
    check_multi_turn(load_config(None, overrides))  # multi-turn off: nothing is checked
