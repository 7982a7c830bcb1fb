"""LoRA on one actor worker (in this process, no Ray): what trains, the reference without a copy,
the merged weights a rollout engine receives, checkpoints that resume exactly or say what differs,
export and evaluation of an adapter, and bad target modules."""

from __future__ import annotations

import json

import pytest
import torch

from armor_core.config.schema import load_config, to_dict

P, R, ROWS = 4, 5, 6


def worker(tmp_path, *overrides: str):
    from armor_core.workers.actor.worker import ActorWorker

    cfg = load_config(
        None,
        [
            "model.lora_rank=4",
            "model.lora_alpha=8",
            "actor.lr=1e-2",  # far past any trust region on random tokens: these tests are about LoRA, not the guard
            "guard.guards=[{name: non_finite}]",
            "actor.use_kl_loss=true",
            f"data.train_batch_size={ROWS}",
            f"actor.ppo_mini_batch_size={ROWS}",
            "rollout.n=1",
            f"rollout.max_new_tokens={R}",
            f"data.max_prompt_length={P}",
            "actor.logprob_chunk_tokens=4",
            "trainer.loggers=[]",
            f"trainer.run_dir={tmp_path / 'run'}",
            *overrides,
        ],
    )
    return ActorWorker(to_dict(cfg))


def batch(seed: int = 0):
    from armor_core.dataproto.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts, responses = torch.randint(4, 19, (ROWS, P), generator=g), torch.randint(4, 19, (ROWS, R), generator=g)
    mask = torch.ones(ROWS, R, dtype=torch.long)
    attn = torch.ones(ROWS, P + R, dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attn,
            "position_ids": torch.arange(P + R).expand(ROWS, -1).contiguous(),
            "responses": responses,
            "response_mask": mask,
            "advantages": torch.randn(ROWS, 1, generator=g).expand(-1, R).contiguous(),
            "ref_log_prob": torch.zeros(ROWS, R),
        }
    )


def base_log_probs(data):
    from armor_core.models.loading import load_model
    from armor_core.workers.forward.layouts import forward_response_logits, response_log_probs

    base = load_model("builtin:arithmetic-tiny")
    with torch.no_grad():
        logits = forward_response_logits(base, data["input_ids"], data["attention_mask"], data["position_ids"], R)
        return response_log_probs(logits, data["responses"], 1.0, False)[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA worker after two updates, with what it looked like before."""
    tmp = tmp_path_factory.mktemp("lora")
    w = worker(tmp)
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    data = batch()
    data["ref_log_prob"] = w.compute_ref_log_prob(data)["ref_log_prob"]
    metrics = [w.update_actor(data, step=1), w.update_actor(data, step=2)]
    return w, before, data, metrics, tmp


def test_only_the_adapters_train_and_sit_in_the_optimizer(trained):
    w, before, _, metrics, _ = trained
    trainable = {n for n, p in w.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for g in w.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in w.model.parameters() if p.requires_grad}
    after = w.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if ".lora_" in k}  # both A and B moved by the second step; nothing else
    assert metrics[1]["actor/grad_norm"] > 0 and metrics[1]["actor/kl_loss"] > 0


def test_the_reference_is_the_base_model_without_a_second_copy(trained):
    w, _, data, _, _ = trained
    assert w.ref_model is None
    want = base_log_probs(data)
    torch.testing.assert_close(data["ref_log_prob"], want, rtol=1e-5, atol=1e-6)  # before the updates
    torch.testing.assert_close(
        w.compute_ref_log_prob(data)["ref_log_prob"], want, rtol=1e-5, atol=1e-6
    )  # and after: adapters off
    policy = w.compute_log_prob(data)["old_log_probs"]
    assert (policy - want).abs().max() > 1e-3  # while the policy itself has moved


def test_the_rollout_engine_gets_the_base_names_with_the_adapters_merged(trained):
    from armor_core.models.loading import load_model
    from armor_core.models.lora import MergedView, merged_weights

    w, _, data, _, _ = trained
    plain = load_model("builtin:arithmetic-tiny")
    view = MergedView(w.model).state_dict()
    assert set(view) == set(plain.state_dict())
    sent = merged_weights(w.model)
    assert set(sent) == {k for k in view if k.endswith("proj.weight")}  # every linear of the decoder, nothing else
    plain.load_state_dict(view)
    ids, attn, pos = data["input_ids"], data["attention_mask"], data["position_ids"]
    with torch.no_grad():
        got = plain(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        want = w.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_checkpoint_resumes_exactly_and_refuses_other_lora_settings(trained, tmp_path):
    from peft import PeftModel

    from armor_core.models.loading import load_model

    w, _, data, _, tmp = trained
    ckpt = tmp_path / "step_2"
    w.save_checkpoint(str(ckpt))
    files = {p.name for p in (ckpt / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files and not (
        ckpt / "model"
    ).exists()
    # peft loads it on the base model and computes what the worker computes
    peft_model = PeftModel.from_pretrained(load_model("builtin:arithmetic-tiny"), str(ckpt / "adapter"))
    with torch.no_grad():
        torch.testing.assert_close(
            peft_model(input_ids=data["input_ids"]).logits,
            w.model(input_ids=data["input_ids"]).logits,
            rtol=1e-5,
            atol=1e-5,
        )
    resumed = worker(tmp)
    resumed.load_checkpoint(str(ckpt))
    for (k, a), b in zip(w.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), k
    for pa, pb in zip(w.optimizer.param_groups[0]["params"], resumed.optimizer.param_groups[0]["params"]):
        assert all(
            torch.equal(w.optimizer.state[pa][s], resumed.optimizer.state[pb][s])
            for s in ("exp_avg", "exp_avg_sq", "step")
        )
    assert resumed.global_step == w.global_step
    _refused(worker(tmp, "model.lora_rank=0"), ckpt, r"model\.lora_rank=0: resume with model\.lora_rank=4")
    _refused(
        worker(tmp, "model.lora_rank=8"), ckpt, r"trained with model\.lora_rank=4, this run has model\.lora_rank=8"
    )
    _refused(worker(tmp, "model.lora_target_modules=[q_proj,v_proj]"), ckpt, r"model\.lora_target_modules")


def _refused(w, ckpt, pattern: str) -> None:
    """The worker refuses the resume with an error the CLI prints as one line (exit 2), also after the trip
    from the actor worker to the driver (pickled)."""
    import pickle

    from armor_core.cli.main import user_errors

    with pytest.raises(ValueError, match=pattern) as e:
        w.load_checkpoint(str(ckpt))
    arrived = pickle.loads(pickle.dumps(e.value))
    assert isinstance(arrived, user_errors()) and str(arrived) == str(e.value)


def test_a_full_checkpoint_does_not_resume_into_a_lora_run(tmp_path):
    full = worker(tmp_path, "model.lora_rank=0")
    full.save_checkpoint(str(tmp_path / "full"))
    _refused(worker(tmp_path), tmp_path / "full", r"holds a full model .*model\.lora_rank=4")


def test_export_merged_or_adapter_alone_and_eval_on_the_adapter(trained, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from armor_core.cli.eval import evaluate
    from armor_core.cli.main import main

    w, _, data, _, _ = trained
    ckpt = tmp_path / "step_2"
    w.save_checkpoint(str(ckpt))
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")  # a plain model directory
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=data["input_ids"]).logits,
            w.model(input_ids=data["input_ids"]).logits,
            rtol=1e-5,
            atol=1e-5,
        )
    assert main(["export", str(ckpt), str(tmp_path / "adapter_only")]) == 0
    assert json.loads((tmp_path / "adapter_only" / "adapter_config.json").read_text())["r"] == 4
    assert main(["export", str(ckpt), str(tmp_path / "merged")]) == 2  # never over a directory with files in it
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "neither adapter/" in capsys.readouterr().err
    on_adapter = evaluate(str(ckpt / "adapter"), "task:arithmetic", size=16)
    on_merged = evaluate(str(tmp_path / "merged"), "task:arithmetic", size=16)
    assert on_adapter == on_merged and on_adapter["rows"] == 16


def test_targets_that_match_nothing_or_cannot_be_wrapped_are_named(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"'qproj' matches no module of Qwen2ForCausalLM; its linear layers are \['down_proj', 'gate_proj', 'k_proj'",
    ):
        worker(tmp_path, "model.lora_target_modules=[qproj]")
    with pytest.raises(
        ValueError, match=r"'input_layernorm' is a Qwen2RMSNorm, a layer type LoRA \(peft\) cannot wrap"
    ):
        worker(tmp_path, "model.lora_target_modules=[input_layernorm]")
    w = worker(tmp_path, "model.lora_target_modules=[q_proj,v_proj]", "actor.use_kl_loss=false")
    assert {n.split(".")[-4] for n, p in w.model.named_parameters() if p.requires_grad} == {"q_proj", "v_proj"}


def test_every_rank_builds_the_same_adapters(tmp_path):
    """The adapters' initialisation depends on trainer.seed only, not on the rank's own RNG stream."""
    from armor_core.workers.actor.worker import ActorWorker

    cfg = to_dict(load_config(None, ["model.lora_rank=4", "trainer.loggers=[]", f"trainer.run_dir={tmp_path}"]))
    a = ActorWorker(cfg, rank=0, world_size=1)
    b = ActorWorker(
        cfg, rank=1, world_size=1
    )  # seeded with trainer.seed + 1 (no process group is needed for the check)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y), k


@pytest.mark.parametrize(
    "override, match",
    [
        ("model.lora_target_modules=qproj", r"expected 'all-linear' or a non-empty list of module names"),
        ("model.lora_target_modules=[]", r"expected 'all-linear' or a non-empty list"),
        ("model.lora_rank=-1", r"model.lora_rank=-1 is out of range"),
        ("model.lora_dropout=1.0", r"model.lora_dropout=1.0 is out of range"),
    ],
)
def test_bad_lora_settings_fail_at_load(override, match):
    from armor_core.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def _retrained_copy(src, dst, *, edge: bool = True):
    """``src`` copied to ``dst`` with other weights of the same shapes (the file keeps its size)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    names = sorted(tensors)
    for name in names if edge else names[len(names) // 2 : len(names) // 2 + 1]:
        tensors[name] = tensors[name] + 1e-3
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_an_adapter_is_used_only_on_the_base_it_was_trained_on(trained, tmp_path):
    """The checkpoint records its base; eval (preflight) and resume refuse a base replaced in place."""
    import shutil

    from armor_core.loop.preflight import check_model_dir
    from armor_core.loop.resume import check_lora_base
    from armor_core.models.loading import ModelPathError, resolve_model_path
    from armor_core.models.lora import BASE_MANIFEST, base_problem
    from armor_core.storage.checkpoint import CheckpointManager

    w, *_ = trained
    run = tmp_path / "run"
    ckpt = CheckpointManager(run).save(2, lambda d: w.save_checkpoint(str(d)), {"step": 2})
    adapter = ckpt / "adapter"
    assert json.loads((adapter / BASE_MANIFEST).read_text())["files"].keys() == {"model.safetensors"}
    builtin = resolve_model_path("builtin:arithmetic-tiny")
    assert base_problem(adapter, builtin) is None
    check_model_dir(adapter)  # armor eval of the adapter: its own base passes
    other = _retrained_copy(builtin, tmp_path / "base")
    assert base_problem(adapter, other) == (
        f"{other / 'model.safetensors'} holds other weights than the adapter's base (same size, different bytes)"
    )
    exported = tmp_path / "exported"  # the adapter copied out, its config pointed at the replaced base
    shutil.copytree(adapter, exported)
    config = json.loads((exported / "adapter_config.json").read_text())
    (exported / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    with pytest.raises(ModelPathError, match=rf"the LoRA adapter in {exported} was trained on another base model"):
        check_model_dir(exported)
    cfg = load_config(None, ["model.lora_rank=4", f"model.path={other}", f"trainer.run_dir={run}"])
    with pytest.raises(ModelPathError, match=rf"checkpoint {ckpt} holds a LoRA adapter trained on another base"):
        check_lora_base(cfg)
    check_lora_base(load_config(None, ["model.lora_rank=4", f"trainer.run_dir={run}"]))  # its own base resumes


def test_a_change_inside_the_weights_away_from_the_file_edges_is_not_seen(trained, tmp_path):
    """The fingerprint's documented limit: it reads the header and 1 MiB at each end of the data, not the middle."""
    from armor_core.models.loading import resolve_model_path
    from armor_core.models.lora import base_manifest

    builtin = resolve_model_path("builtin:arithmetic-tiny")
    if (builtin / "model.safetensors").stat().st_size < 3 << 20:
        pytest.skip("the built-in model is smaller than the two fingerprinted MiB: every byte is read")
    other = _retrained_copy(builtin, tmp_path / "base", edge=False)
    assert base_manifest(other) == base_manifest(builtin)
