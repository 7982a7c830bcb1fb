"""On-policy distillation on the driver (``loop/distill.py``): a teacher with another tokenizer is an
error at start naming both vocabularies; the distillation reward enters the token-level rewards as
configured."""

from __future__ import annotations

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
