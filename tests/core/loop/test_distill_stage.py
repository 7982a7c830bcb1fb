"""On-policy distillation on the driver (``loop/distill.py``): a teacher with another tokenizer is an
error at start naming both vocabularies; the distillation reward enters the token-level rewards as
configured."""

from __future__ import annotations

import shutil

import pytest
import torch

from armor_core.config.schema import ConfigError, load_config
from armor_core.dataproto.protocol import DataProto
from armor_core.loop.distill import Distillation, check_teacher
from armor_core.loop.preflight import check_run
from armor_core.models.loading import build_char_tokenizer, build_tiny_model

BUILTIN = "builtin:arithmetic-tiny"


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_a_teacher_with_another_vocabulary_is_an_error_naming_both(tmp_path):
    teacher = tmp_path / "teacher"
    tok = build_char_tokenizer("0123456789+-*=abc")  # the student's characters and three more
    build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2).save_pretrained(teacher)
    tok.save_pretrained(teacher)
    cfg = _cfg(f"algorithm.distill.teacher={teacher}")
    with pytest.raises(ConfigError) as e:
        check_run(cfg)  # what armor run (and --dry-run) checks before any worker starts
    msg = str(e.value)
    assert "algorithm.distill.teacher" in msg and str(teacher) in msg and "arithmetic-tiny" in msg
    assert f"vocabulary of {len(tok)} tokens" in msg and "vocabulary of 19 tokens" in msg
    assert "'a'" in msg  # a token the teacher has and the student lacks


def test_a_teacher_with_the_students_tokenizer_passes_and_no_teacher_checks_nothing(tmp_path):
    check_teacher(_cfg(f"algorithm.distill.teacher={BUILTIN}"))
    check_teacher(_cfg("algorithm.distill.teacher=/does/not/exist/unless/distilling", "algorithm.distill.teacher=null"))
    with pytest.raises(Exception, match="does/not/exist"):
        check_teacher(_cfg("algorithm.distill.teacher=/does/not/exist"))


def test_a_damaged_teacher_is_refused_naming_algorithm_distill_teacher(tmp_path):
    from armor_core.models.loading import ModelPathError, resolve_model_path

    teacher = tmp_path / "teacher"
    shutil.copytree(resolve_model_path(BUILTIN), teacher)
    (teacher / "model.safetensors").write_bytes(b"")
    for path in (teacher, tmp_path / "nowhere"):
        with pytest.raises(ModelPathError, match=rf"^algorithm.distill.teacher={path}: "):
            check_run(_cfg(f"algorithm.distill.teacher={path}"))


def _teacher(tmp_path, vocab_size: int):
    """A teacher with the student's tokenizer and a head of ``vocab_size`` rows (padding rows, as Qwen pads its
    vocabulary to a multiple of 64 or 128: 151936 in Qwen2.5-0.5B, 152064 in 7B)."""
    from armor_core.models.loading import load_tokenizer

    teacher = tmp_path / f"teacher-{vocab_size}"
    model = build_tiny_model("qwen2", vocab_size, hidden_size=64, num_layers=1, num_heads=2, seed=3)
    with torch.no_grad():  # the rows past the student's vocabulary hold the largest logits: a top-k would pick them
        model.get_output_embeddings().weight[19:] = model.get_output_embeddings().weight[:1] * 50
    model.save_pretrained(teacher)
    load_tokenizer(BUILTIN).save_pretrained(teacher)
    return teacher


def test_a_teacher_with_a_larger_vocabulary_scores_over_the_students(tmp_path):
    from armor_core.config.schema import to_dict
    from armor_core.workers.teacher import TeacherWorker

    teacher = _teacher(tmp_path, 19 + 13)  # the student's 19 tokens and 13 padding rows
    cfg = _cfg(
        f"algorithm.distill.teacher={teacher}", "algorithm.distill.mode=topk_forward_kl", "algorithm.distill.k=4"
    )
    check_run(cfg)
    worker = TeacherWorker(to_dict(cfg))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(6)[None],
            "responses": ids[:, 3:],
            "response_mask": torch.ones(1, 3),
        }
    )
    out = worker.compute_teacher_log_prob(batch)
    logits = worker.model(input_ids=ids).logits[0, 2:5].float()  # what the teacher says over the shared 19 tokens
    want = logits[:, :19].log_softmax(-1)
    assert logits.shape[-1] == 19 and int(out["teacher_topk_ids"].max()) < 19  # the student can gather them
    assert torch.allclose(out["teacher_topk_log_probs"][0], want.topk(4, -1).values, atol=1e-5)
    assert torch.allclose(out["teacher_log_prob"][0], want.gather(-1, ids[0, 3:, None])[:, 0], atol=1e-5)


def test_a_teacher_with_a_smaller_vocabulary_than_the_student_is_refused(tmp_path):
    teacher = _teacher(tmp_path, 19)
    student = tmp_path / "student"
    build_tiny_model("qwen2", 24, hidden_size=64, num_layers=1, num_heads=2).save_pretrained(student)
    from armor_core.models.loading import load_tokenizer

    load_tokenizer(BUILTIN).save_pretrained(student)
    with pytest.raises(ConfigError, match=r"algorithm.distill.teacher=.*vocab_size 19 .* student's 24"):
        check_run(_cfg(f"model.path={student}", f"algorithm.distill.teacher={teacher}"))


def test_distillation_config_is_checked():
    with pytest.raises(ConfigError, match="algorithm.distill.mode"):
        _cfg("algorithm.distill.mode=forward")
    with pytest.raises(ConfigError, match="algorithm.distill.k"):
        _cfg("algorithm.distill.k=0")
    with pytest.raises(ConfigError, match="algorithm.distill.teacher is not set"):
        _cfg("algorithm.distill.with_rewards=false")  # no teacher and no rewards: nothing to train on
    with pytest.raises(ConfigError, match="algorithm.distill.teacher is not set"):
        load_config("recipe:distill", [])  # the recipe names no teacher: the user gives theirs
    assert load_config("recipe:distill", ["algorithm.distill.teacher=x"]).algorithm.distill.mode == "topk_forward_kl"


def _batch():
    return DataProto.from_dict(
        tensors={
            "response_mask": torch.tensor([[1.0, 1.0, 0.0]]),
            "rollout_log_probs": torch.tensor([[-1.0, -0.5, 0.0]]),
            "teacher_log_prob": torch.tensor([[-2.0, -0.25, 0.0]]),
        }
    )


@pytest.mark.parametrize(
    "overrides,want",
    [
        # score 1 on the last token, minus coef * (log p_S - log p_T) = 0.5 * (1, -0.25) per token
        (["algorithm.distill.coef=0.5"], [[-0.5, 1.125, 0.0]]),
        (["algorithm.distill.coef=0.5", "algorithm.distill.with_rewards=false"], [[-0.5, 0.125, 0.0]]),
        (["algorithm.distill.via=loss"], [[0.0, 1.0, 0.0]]),  # the signal is the actor's loss term
        (["algorithm.distill.via=loss", "algorithm.distill.with_rewards=false"], [[0.0, 0.0, 0.0]]),
        (["algorithm.distill.mode=topk_forward_kl"], [[0.0, 1.0, 0.0]]),
    ],
)
def test_the_distillation_reward_enters_the_token_level_rewards(overrides, want):
    d = Distillation(_cfg(f"algorithm.distill.teacher={BUILTIN}", *overrides), group=None)
    scores = torch.tensor([[0.0, 1.0, 0.0]])
    assert torch.allclose(d.rewards(_batch(), scores), torch.tensor(want))
