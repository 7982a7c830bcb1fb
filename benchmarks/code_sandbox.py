"""The code domain's sandbox: programs per second through the reward pool, overhead per program against
a bare ``subprocess.run``, and what the sandbox stops and what it does not.

    python benchmarks/code_sandbox.py               # about 20 s on 2 cores
    python benchmarks/code_sandbox.py --rows 200 --workers 2

Throughput: ``--rows`` rows of a small stdin/stdout problem (two cases each) scored by a RewardManager
with ``--workers`` pool processes, after a warm-up batch. Overhead: one sandboxed run of one case
(``LocalSandbox.run``) against ``subprocess.run([python, -c, program])`` of the same program, median of
``--repeat``. The table of attacks runs the pack's adversarial programs (its tests hold the assertions)
and prints each one's score and time; then the documented limits of the weaker modes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from armor_rewards_code.domain import code_reward
from armor_rewards_code.sandbox import LocalSandbox, sandbox_python

from armor_core.config.schema import RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager

TRUTH = {"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20\n"]}
PROGRAM = "print(int(input()) * 2)"
PARAMS = {"timeout_s": 1.0, "total_timeout_s": 2.0, "memory_mb": 256, "max_processes": 16}

NOT_STOPPED = (
    ("reading the host's system directories", "/usr and the libraries, read-only: what Python needs; nothing else"),
    (
        "network, host files and processes",
        "only where namespaces, seccomp and Landlock are all refused: isolated sub-score 0",
    ),
    ("memory across processes", "each process has its own address-space limit; processes x memory in all"),
)


def throughput(rows: int, workers: int) -> float:
    with RewardManager(RewardConfig(num_workers=workers, domain_kwargs={"code": PARAMS}), PluginManager()) as rm:

        def score(n: int) -> None:
            batch = rm.score([""] * n, [f"```python\n{PROGRAM}\n```"] * n, ["code"] * n, [TRUTH] * n)
            assert batch.scores.min() == 1.0, batch.errors

        score(workers * 2)
        start = time.perf_counter()
        score(rows)
        return rows / (time.perf_counter() - start)


def overhead(repeat: int) -> tuple[float, float]:
    sandbox, python = LocalSandbox(), sandbox_python()
    config = {
        "mode": "stdio",
        "source": PROGRAM,
        "inputs": ["3\n"],
        "n_cases": 1,
        "timeout_s": 1.0,
        "total_s": 2.0,
        "cpu_s": 1,
    }
    bare, boxed = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([python, "-I", "-S", "-c", PROGRAM], input=b"3\n", capture_output=True, check=True)
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert sandbox.run(config, None, 3.0).report is not None
        boxed.append(time.perf_counter() - start)
    return statistics.median(bare), statistics.median(boxed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rate = throughput(args.rows, args.workers)
    bare, boxed = overhead(args.repeat)
    print(f"| measure | value |\n|---|---|\n| programs/s ({args.workers} pool workers, 2 cases each) | {rate:.1f} |")
    print(
        f"| bare subprocess.run, one case | {bare * 1000:.1f} ms |\n| sandboxed run, one case | {boxed * 1000:.1f} ms |"
    )
    print(f"| overhead per program | {(boxed - bare) * 1000:.1f} ms |\n")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "armor_rewards_code" / "tests"))
    from test_code_adversarial import ATTACKS

    print("| attack | score | seconds |\n|---|---|---|")
    for name, (program, truth) in ATTACKS.items():
        start = time.perf_counter()
        score = code_reward("", f"```python\n{program}\n```", truth, {}, **PARAMS).score
        print(f"| {name} | {score:g} | {time.perf_counter() - start:.2f} |")
    print("\n| not stopped | why |\n|---|---|")
    for what, why in NOT_STOPPED:
        print(f"| {what} | {why} |")


if __name__ == "__main__":
    main()
