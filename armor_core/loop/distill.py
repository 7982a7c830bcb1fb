"""On-policy distillation on the driver (``algorithm.distill``): the teacher stage of a step and its
check at start.

``Distillation`` is one collaborator of ``Step`` with one call per stage it concerns:

- ``teacher_pass`` (the log-probs stage, beside the reference pass): the teacher worker group
  (``workers/teacher.py``) scores the batch's sampled tokens: ``teacher_log_prob`` and, for
  ``topk_forward_kl``, the teacher's top-k ids and log-probs; metrics ``distill/teacher_logp`` and
  ``distill/reverse_kl`` (means per response token; the student's log-probs are the behaviour
  policy's, old or rollout);
- ``rewards`` (the advantage stage, after the KL-in-reward penalty): with ``mode=reverse_kl`` and
  ``via=reward`` it adds ``-coef * (log p_S - log p_T)`` to each token's reward; with
  ``with_rewards=false`` the domains' scores are dropped first, so the advantage comes from the
  distillation signal alone. The loss forms (``via=loss``, ``topk_forward_kl``) are the actor's
  (``workers/losses/distill_loss.py``): the teacher's tensors travel in the update batch.

``check_teacher`` (called by ``preflight.check_run``): the teacher directory is a loadable model (an error
names ``algorithm.distill.teacher``), its tokenizer is the student's, token for token (a mismatch names both
vocabularies), and its head has at least the student's rows (a larger one is scored over the student's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from armor_core.config.schema import ArmorConfig, ConfigError
from armor_core.workers.api import TeacherAPI
from armor_core.workers.losses.distill_loss import compute_distill_reverse_kl
from armor_core.workers.teacher import vocab_size

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto
    from armor_core.engine import WorkerGroup
    from armor_core.loop.step_timer import StepTimer

__all__ = ["TEACHER_KEYS", "Distillation", "check_teacher"]

#: the teacher's tensors the actor's update reads (the loss forms)
TEACHER_KEYS = ("teacher_log_prob", "teacher_topk_log_probs", "teacher_topk_ids")


class Distillation:
    """The teacher stage and the reward shaping of ``algorithm.distill``; ``group``: the teacher WorkerGroup."""

    def __init__(self, cfg: ArmorConfig, group: WorkerGroup) -> None:
        self.cfg, self.group = cfg.algorithm.distill, group

    def teacher_pass(self, batch: DataProto, timer: StepTimer, metrics: dict[str, float]) -> DataProto:
        """``batch`` with the teacher's tensors; the ``teacher`` stage's time in ``timer``."""
        with timer("teacher") as stage:
            out = self.group.dispatch(TeacherAPI.compute_teacher_log_prob, batch)
            worker = out.meta_info.pop("metrics", {})
            stage.worker_s = worker.pop("perf/worker_s", None)
            batch = batch.union(out)
        mask = batch["response_mask"].float()
        n = mask.sum().clamp(min=1)
        rkl = compute_distill_reverse_kl(_behaviour(batch), batch["teacher_log_prob"], mask)
        metrics["distill/reverse_kl"] = float(rkl.sum() / n)
        metrics["distill/teacher_logp"] = float((batch["teacher_log_prob"] * mask).sum() / n)
        metrics.update(worker)
        return batch

    def rewards(self, batch: DataProto, rewards: torch.Tensor) -> torch.Tensor:
        """The token-level rewards the advantage estimator sees."""
        d = self.cfg
        if not d.with_rewards:
            rewards = torch.zeros_like(rewards)
        if d.mode == "reverse_kl" and d.via == "reward":
            mask = batch["response_mask"].float()
            rkl = compute_distill_reverse_kl(_behaviour(batch), batch["teacher_log_prob"], mask)
            rewards = rewards - d.coef * rkl.to(rewards.dtype)
        return rewards


def _behaviour(batch: DataProto) -> torch.Tensor:
    """The student's log-probs of its sampled tokens: old (recomputed) if present, else the rollout's."""
    return batch["old_log_probs"] if "old_log_probs" in batch else batch["rollout_log_probs"]


def check_teacher(cfg: ArmorConfig) -> None:
    """With ``algorithm.distill.teacher`` set: the teacher is a model directory (``preflight.check_model``), its
    tokenizer maps every token to the same id as the student's, and its head has at least the student's rows.

    A larger head is fine: models pad their vocabulary past the tokenizer (Qwen2.5-0.5B to 151936 rows, 7B to
    152064), and the teacher worker scores over the student's rows only (``workers/teacher.keep_rows``).

    :raises ModelPathError: the teacher's directory, named ``algorithm.distill.teacher=...``; ``ConfigError``: the
        vocabularies differ, naming both (size, path, a few differing tokens), or the teacher's head is smaller.
    """
    teacher = cfg.algorithm.distill.teacher
    if not teacher:
        return
    from armor_core.loop.preflight import check_model, named
    from armor_core.models.loading import load_tokenizer, resolve_model_path

    trust = cfg.model.trust_remote_code
    key = "algorithm.distill.teacher"
    with named(key, teacher):
        check_model(teacher, trust_remote_code=trust)
        teacher_path = str(resolve_model_path(teacher))
    student_path = cfg.model.tokenizer_path or str(resolve_model_path(cfg.model.path))
    student = load_tokenizer(student_path, trust_remote_code=trust).get_vocab()
    theirs = load_tokenizer(teacher_path, trust_remote_code=trust).get_vocab()
    if student != theirs:
        only_s, only_t = sorted(set(student) - set(theirs))[:5], sorted(set(theirs) - set(student))[:5]
        moved = sorted((t for t in student if t in theirs and student[t] != theirs[t]), key=lambda t: student[t])
        raise ConfigError(
            f"{key}={teacher!r}: the teacher's tokenizer ({teacher_path}, vocabulary of "
            f"{len(theirs)} tokens) is not the student's ({student_path}, vocabulary of {len(student)} tokens): "
            f"only the student has {only_s}, only the teacher has {only_t}, {len(moved)} shared token(s) have other "
            f"ids (e.g. {moved[:5]}). Distillation compares log-probs token by token: use a teacher trained with the "
            "student's tokenizer"
        )
    rows_s, rows_t = vocab_size(resolve_model_path(cfg.model.path)), vocab_size(teacher_path)
    if rows_s is not None and rows_t is not None and rows_t < rows_s:
        raise ConfigError(
            f"{key}={teacher!r}: the teacher's vocab_size {rows_t} (config.json) is smaller than the student's "
            f"{rows_s}: the student can sample ids past the teacher's head, which the teacher cannot score. Use a "
            "teacher whose vocab_size is at least the student's (a larger one is scored over the student's ids)"
        )
