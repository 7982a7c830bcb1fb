"""The ``code`` reward domain: run a response's program against the row's tests in the sandbox.

``fn(prompt, response, ground_truth, extra, **params)``; params from ``reward.domain_kwargs.code``.
The score is the fraction of cases passed (``partial=True``) or 1 only when every case passes.
Sub-scores: ``compiled`` (the program compiled), ``passed`` (fraction of cases passed), ``timeouts``
and ``runtime_errors`` (fractions of cases), ``no_code`` (no program found: score 0), ``isolated``
(1 when the run could reach neither the network nor the host's files and processes; see ``sandbox.py``).
Not inline: it runs in the reward pool's worker processes, and bounds its own time with
``total_timeout_s`` (keep it under ``reward.timeout_s``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from armor_core import RewardResult
from armor_rewards_code.cases import Plan, extract_program, plan_of, runner_of, same_stdout, same_value
from armor_rewards_code.harness import decode, encode
from armor_rewards_code.remote import SandboxFusion
from armor_rewards_code.sandbox import Limits, LocalSandbox

__all__ = ["check_code_truth", "code_reward", "score_report"]

_SUBS = ("compiled", "passed", "timeouts", "runtime_errors", "no_code", "isolated")


@functools.lru_cache(maxsize=8)
def _sandbox(limits: Limits, require_isolation: bool, sandbox_url: str | None) -> LocalSandbox | SandboxFusion:
    if sandbox_url:
        return SandboxFusion(sandbox_url, limits)
    return LocalSandbox(limits, require_isolation=require_isolation)


def check_code_truth(ground_truth: Any, extra: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` for a row the domain cannot score (checked when the dataset is loaded)."""
    plan_of(ground_truth, extra)
    runner = runner_of(str(extra.get("language", "python")), extra)
    if runner.argv is not None and plan_of(ground_truth, extra).mode != "stdio":
        raise ValueError(f"language {extra.get('language')!r} runs stdin/stdout tests only")


def score_report(plan: Plan, report: dict | None, float_tol: float) -> tuple[list[bool], dict[str, float]]:
    """Per case, passed or not, judged here in the parent on the harness's data; and the sub-scores.

    No report (the harness was killed, or printed something else) fails every case."""
    n = len(plan.tests) if plan.mode == "assert" else len(plan.inputs)
    cases = (report or {}).get("cases") or []
    if len(cases) != n or not (report or {}).get("compiled"):
        status = "timeout" if report is None else "error" if report.get("compiled") else "compile_error"
        cases = [{"status": status}] * n
    passed = []
    for i, case in enumerate(cases):
        ok = case.get("status") == "ok"
        if plan.mode == "stdio":
            ok = ok and same_stdout(str(case.get("stdout", "")), plan.outputs[i], float_tol)
        elif plan.mode == "call":
            try:
                ok = ok and same_value(decode(case["value"]), plan.outputs[i], float_tol)
            except (KeyError, TypeError, ValueError):
                ok = False
        else:
            ok = ok and case.get("passed") is True
        passed.append(ok)
    subs = {
        "compiled": float(bool((report or {}).get("compiled"))),
        "passed": sum(passed) / n,
        "timeouts": sum(c.get("status") == "timeout" for c in cases) / n,
        "runtime_errors": sum(c.get("status") in ("error", "failed") for c in cases) / n,
    }
    return passed, subs


def code_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    language: str = "python",
    whole_response: bool = False,
    partial: bool = False,
    float_tol: float = 0.0,
    timeout_s: float = 2.0,
    total_timeout_s: float = 6.0,
    memory_mb: int = 512,
    max_processes: int = 32,
    require_isolation: bool = False,
    sandbox_url: str | None = None,
) -> RewardResult:
    """Score a program on its row's tests (see the module docstring).

    :param language: the language when the row has no ``extra["language"]``.
    :param whole_response: the whole response is the program (no fenced block needed).
    :param partial: score the fraction of cases passed instead of all-or-nothing.
    :param float_tol: numbers in outputs match within this relative or absolute tolerance (0: exactly).
    :param timeout_s: wall (and CPU) time of one case; ``total_timeout_s``: of the whole row.
    :param require_isolation: fail (the row's failure score) where the kernel refuses the namespaces.
    :param sandbox_url: run in a SandboxFusion service at this address (``remote.py``) instead of locally.
    """
    plan = plan_of(ground_truth, extra)
    runner = runner_of(str(extra.get("language", language)), extra)
    sandbox = _sandbox(Limits(memory_mb=memory_mb, processes=max_processes), require_isolation, sandbox_url)
    program = extract_program(response, runner, whole_response=whole_response)
    if not program:
        return RewardResult(0.0, {**dict.fromkeys(_SUBS, 0.0), "no_code": 1.0, "isolated": float(sandbox.isolated)})
    n = len(plan.tests) if plan.mode == "assert" else len(plan.inputs)
    config = {
        "mode": plan.mode,
        "source": program,
        "argv": list(runner.argv) if runner.argv else None,
        "filename": runner.filename,
        "n_cases": n,
        "inputs": plan.inputs if plan.mode == "stdio" else [encode(list(a)) for a in plan.inputs],
        "fn_name": plan.fn_name,
        "timeout_s": timeout_s,
        "total_s": total_timeout_s,
        "cpu_s": max(1, math.ceil(timeout_s)),
    }
    secret = (
        {"tests": list(plan.tests), "entry_point": plan.fn_name, "setup": plan.setup, "check": plan.check}
        if plan.mode == "assert"
        else None
    )
    run = sandbox.run(config, secret, total_timeout_s + 1.0)
    passed, subs = score_report(plan, run.report, float_tol)
    score = subs["passed"] if partial else float(all(passed))
    return RewardResult(score, {**subs, "no_code": 0.0, "isolated": float(run.isolated)})
