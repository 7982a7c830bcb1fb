"""What a run leaves on the host: every process a program started dies with its row (when the row ends,
and when the reward worker running it is killed), as root and as an ordinary user; and its files stay
within the scratch cap, with or without namespaces."""

import os
import secrets
import shutil
import signal
import tempfile
import time

import pytest
from armor_rewards_code.domain import code_reward

from armor_rewards_code import domain, sandbox

LIMITS = {"timeout_s": 1.0, "total_timeout_s": 2.0, "memory_mb": 256, "max_processes": 16}
# a daemon: forks twice, leaves the program's session, and sleeps ``linger`` seconds with a marker on its command line
DAEMON = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep({linger})', {marker!r}])\n"
    "    os._exit(0)\n"
    "time.sleep({sleep})\n"
    "print(5)\n"
)
STDIO = {"inputs": ["2\n"], "outputs": ["4\n"]}


def _row(program, **limits):
    return code_reward("", f"```python\n{program}\n```", STDIO, {}, **{**LIMITS, **limits})


def test_every_process_a_program_started_dies_with_its_row(mode, processes):
    marker = f"armor-daemon-{secrets.token_hex(4)}"
    assert _row(DAEMON.format(marker=marker, sleep=0.3, linger=8)).score == 0.0
    assert processes.gone(marker) == []


@pytest.mark.slow
def test_every_process_dies_when_the_worker_running_the_row_is_killed(mode, processes):
    # a reward worker that overruns reward.timeout_s is killed: what its row started goes with it
    marker = f"armor-daemon-{secrets.token_hex(4)}"
    # the worker's temporary directory is this test's own (sticky and world-writable, as /tmp): only its run's
    # scratch directory can appear there, whatever else on the host makes one meanwhile
    private = tempfile.mkdtemp(prefix="armor-test-")
    os.chmod(private, 0o1777)
    worker = os.fork()
    if worker == 0:
        try:
            tempfile.tempdir = private
            # the program and its daemon outlive this test unless something kills them: neither's own end can pass
            # for the supervisor's
            _row(DAEMON.format(marker=marker, sleep=60, linger=60), timeout_s=60.0, total_timeout_s=61.0)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 5.0
        while not processes.marked(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes.marked(marker), "the daemon never started"
        supervisors = processes.children(worker)  # the sandbox's child: the run's supervisor
    finally:
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
    # the supervisor learns of it from the parent-death signal or its 0.1 s look at its parent, within a
    # moment; 15 s is for a loaded machine, and what the processes were doing is said if it is not enough
    left = processes.marked(marker)
    deadline = time.monotonic() + 15.0
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes.marked(marker)
    said = "" if not left else processes.describe(left + supervisors)
    assert processes.gone(marker, within_s=0.0) == [], said
    deadline = time.monotonic() + 5.0  # the supervisor removes it after the last process ended
    while os.listdir(private) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert os.listdir(private) == []  # nor its scratch directory (with namespaces there is none on the host)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_the_runs_processes_are_the_kernels_first_choice_under_memory_pressure(mode, processes):
    # oom_score_adj 1000, inherited by everything the program starts: not the supervisor, not the trainer
    import threading

    marker = f"armor-daemon-{secrets.token_hex(4)}"
    row = threading.Thread(target=_row, args=(DAEMON.format(marker=marker, sleep=1.0, linger=8),))
    row.start()
    try:
        deadline = time.monotonic() + 5.0
        while not (found := processes.marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert found, "the daemon never started"
        assert {open(f"/proc/{pid}/oom_score_adj").read().strip() for pid in found} == {"1000"}
        assert open("/proc/self/oom_score_adj").read().strip() != "1000"  # the worker's own is untouched
    finally:
        row.join()
    assert processes.gone(marker) == []


def test_an_ordinary_users_rows_leave_no_process_either(processes, as_nobody):
    # no uid of its own to kill: the run's PID namespace, or its supervisor, ends what the program started
    marker = f"armor-daemon-{secrets.token_hex(4)}"

    def row():
        domain._sandbox.cache_clear()  # made, and probed, as this user
        _row(DAEMON.format(marker=marker, sleep=0.3, linger=8))
        return domain._sandbox(domain.Limits(memory_mb=256, processes=16), False, None).confinement

    confinement = as_nobody(row)
    assert processes.gone(marker) == [], confinement


FILL = (  # 1 MiB files, each under the per-file limit, past an 8 MiB scratch cap; prints 'done' if never stopped
    "import time\nfor i in range(40):\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * (1 << 20))\n"
    "    time.sleep(0.01)\nprint('done')"
)


def test_the_scratch_directory_has_a_total_cap(mode):
    box = sandbox.LocalSandbox(sandbox.Limits(memory_mb=256, file_size_mb=4, scratch_mb=8))
    config = {"mode": "stdio", "source": FILL, "argv": None, "filename": "main.py", "n_cases": 1, "inputs": [""]}
    run = box.run({**config, "fn_name": "", "timeout_s": 3.0, "total_s": 3.0, "cpu_s": 3}, None, 4.0)
    case = ((run.report or {}).get("cases") or [{}])[0]
    assert case.get("status") != "ok" and "done" not in case.get("stdout", ""), run
    if mode == "namespaces":  # a size-limited tmpfs: the program's write fails
        assert "No space left on device" in case.get("error", ""), run
    else:  # the host's disk: the run is stopped, and says why
        assert run.report is None and "scratch cap of 8 MB" in run.error, run
