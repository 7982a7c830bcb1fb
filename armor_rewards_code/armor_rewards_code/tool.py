"""The code sandbox as a tool: ``armor_rewards_code.tool:python`` for the multi-turn ``tools`` environment.

    rollout:
      multi_turn:
        enable: true
        environment: tools
        environment_kwargs:
          tools: [armor_rewards_code.tool:python]

A call ``{"name": "python", "arguments": {"code": "print(2**10)"}}`` runs the code as a program in the
same local sandbox as the ``code`` reward domain (``sandbox.py``: its own session, scrubbed environment,
limits on time, memory, processes, files and output, network and the host's files and processes shut
where the kernel allows), with an empty stdin, and answers with what it printed: stdout, then stderr, each
cut to ``MAX_CHARS``; or an error text (a syntax error, the time limit, a non-zero exit status, the scratch
cap, a harness the program killed: what really ended it). It never
raises for anything the code does, so the policy reads every failure as an observation.

The limits are keyword-only, so the policy can neither see nor set them; a row's
``extra.tools_kwargs.python`` may (``timeout_s``, ``memory_mb``, ``require_isolation``). One sandbox is
probed per process and limits, and reused by every call.
"""

from __future__ import annotations

import functools
import math

from armor_rewards_code.sandbox import Limits, LocalSandbox

__all__ = ["MAX_CHARS", "python"]

#: stdout and stderr are each cut to this many characters (a tool result is tokens in the context)
MAX_CHARS = 2000


@functools.lru_cache(maxsize=4)
def _sandbox(memory_mb: int, require_isolation: bool) -> LocalSandbox:
    return LocalSandbox(Limits(memory_mb=memory_mb, output_bytes=4 * MAX_CHARS), require_isolation=require_isolation)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"\n[... {len(text) - MAX_CHARS} more characters]"


def python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 256, require_isolation: bool = False) -> str:
    """Run a Python program in a sandbox and return what it printed (stdout, then stderr).

    Args:
        code: a complete Python program that prints its results, e.g. "print(sum(range(10)))".
    """
    if not isinstance(code, str) or not code.strip():
        return "error: no code to run"
    config = {
        "mode": "stdio",
        "source": code,
        "argv": None,
        "filename": "main.py",
        "n_cases": 1,
        "inputs": [""],
        "fn_name": "",
        "timeout_s": float(timeout_s),
        "total_s": float(timeout_s),
        "cpu_s": max(1, math.ceil(timeout_s)),
        "stderr": True,
    }
    run = _sandbox(int(memory_mb), bool(require_isolation)).run(config, None, float(timeout_s) + 1.0)
    report = run.report
    if report is None:  # say what happened: a deadline, a cap, or a harness the program killed
        if run.killed:
            return f"error: the program ran past its {timeout_s:g} s limit and was stopped"
        if run.error:
            return f"error: {run.error}; it was stopped after {run.seconds:.2f} s"
        how = f"was {run.ended}" if run.ended.startswith("killed") else f"ended with {run.ended or 'no status'}"
        return f"error: the sandbox's harness {how} after {run.seconds:.2f} s and left no result"
    if not report.get("compiled"):
        return f"error: {report.get('error', 'the program does not compile')}"
    case = (report.get("cases") or [{}])[0]
    text = _cut(str(case.get("stdout", "")))
    if case.get("stderr"):
        text += ("\n" if text and not text.endswith("\n") else "") + "[stderr]\n" + _cut(str(case["stderr"]))
    status = case.get("status")
    if status == "timeout":
        return f"{text}\nerror: the program ran past its {timeout_s:g} s limit and was stopped".lstrip("\n")
    if status != "ok":  # the traceback is in stderr already; name what else went wrong
        error = str(case.get("error") or "")
        why = error if error.startswith("output over") or (error and not case.get("stderr")) else ""
        why = why or f"exit status {case.get('exit_code')}"
        return f"{text}\nerror: {why}".lstrip("\n")
    return text or "(no output)"
