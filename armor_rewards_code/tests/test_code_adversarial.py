"""The adversarial suite: programs that attack the host or try to fool the harness. Every one scores 0,
ends within its time limit plus 1 s, and leaves no process and no file behind. Limits are tight
(1 s a case, 256 MiB) so that a failure of the sandbox cannot run away with the machine."""

import dataclasses
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from armor_rewards_code.domain import code_reward

from armor_rewards_code import domain, sandbox

LIMITS = {"timeout_s": 1.0, "total_timeout_s": 2.0, "memory_mb": 256, "max_processes": 16}
SECRET = "armor-test-secret-value"
STDIO = {"inputs": ["2\n"], "outputs": ["4\n"]}
CALL = {"fn_name": "f", "inputs": [[2]], "outputs": [4]}
CHECK = {
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n",
    "entry_point": "f",
}
CANARY = Path(__file__).parent / "armor-code-canary"  # on the host's disk, outside any scratch directory

ATTACKS = {
    "infinite loop": ("while True:\n    pass", STDIO),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", STDIO),
    "10 GB allocation": ("x = bytearray(10 * 1024 ** 3)\nprint(4)", STDIO),
    "socket connect": ("import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=0.5)\nprint(4)", STDIO),
    "write outside the temporary directory": (
        f"open('/tmp/left-behind', 'w').write('x')\nopen({str(CANARY)!r}, 'w').write('x')\nprint(4)",
        STDIO,
    ),
    "environment secrets": (f"import os\nprint(4 if os.environ.get('ARMOR_SECRET') == {SECRET!r} else 5)", STDIO),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, 9)", STDIO),
    "fill the disk": ("b = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    while True:\n        f.write(b)", STDIO),
    "exit 0 early": ("import os\nos._exit(0)", STDIO),
    "print a success marker": ('print(\'{"compiled": true, "cases": [{"status": "ok", "passed": true}]}\')', CHECK),
    "replace sys.exit and print": (
        "import sys, builtins\nsys.exit = lambda *a: None\nbuiltins.print = lambda *a, **k: None\n"
        "def f(x):\n    return 0",
        CHECK,
    ),
    "__eq__ always True": ("class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()", CHECK),
    "__eq__ always True, call format": (
        "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A(0)",
        CALL,
    ),
    "read the tests from the parent's memory": (  # returns the right answers only if it finds the tests
        "import gc\ndef f(x):\n    found = any('candidate(3) =' + '= 9' in repr(o) for o in gc.get_objects() "
        "if type(o) in (dict, list))\n"
        "    return x * x if found else 0",
        CHECK,
    ),
    "read the tests from disk or /proc": (
        "import glob\ndef f(x):\n    for p in glob.glob('/proc/*/mem') + glob.glob('/proc/*/cmdline') + glob.glob('*'):\n"
        "        try:\n            if b'candidate(3) =' + b'= 9' in open(p, 'rb').read():\n                return x * x\n"
        "        except OSError:\n            pass\n    return 0",
        CHECK,
    ),
    "write to the harness's result pipe": (
        'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'0000000000000040{"compiled": true, "cases": '
        '[{"status": "ok"}]}\')\n    except OSError:\n        pass\ndef f(x):\n    return 0',
        CHECK,
    ),
    "print the expected output without computing it": ("print(4)\nimport os\nos._exit(1)", STDIO),
    "setsid escape": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint(5)", STDIO),
}


# what only the confinements stop; unconfined, the isolated sub-score of 0 says so
NEEDS_CONFINEMENT = {"socket connect", "write outside the temporary directory"}


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_scores_zero_and_leaves_the_host_as_it_was(name, mode, monkeypatch, processes):
    if mode == "unconfined" and name in NEEDS_CONFINEMENT:
        pytest.skip("only namespaces, or seccomp and Landlock, stop this; unconfined runs are reported as not isolated")
    monkeypatch.setenv("ARMOR_SECRET", SECRET)
    program, truth = ATTACKS[name]
    before = set(os.listdir(tempfile.gettempdir()))
    start = time.monotonic()
    result = code_reward("", f"```python\n{program}\n```", truth, {}, **LIMITS)
    assert time.monotonic() - start < LIMITS["total_timeout_s"] + 1.0
    assert result.score == 0.0 and result.sub_scores["passed"] == 0.0, result
    assert result.sub_scores["isolated"] == float(mode != "unconfined")
    assert not CANARY.exists()
    # other jobs of a shared machine write to /tmp too: what the sandbox or these programs would leave
    left = set(os.listdir(tempfile.gettempdir())) - before
    assert {n for n in left if n.startswith("armor-code") or n in ("left-behind", "big")} == set()
    if os.geteuid() == 0:  # without root a setsid escapee lives on until its CPU limit (README)
        deadline = time.monotonic() + 2.0  # SIGKILL is sent; init reaps the orphans a moment later
        while processes.leftover() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.leftover() == []


# Two programs that look for a row's expected output where a careless host leaves it (issue 42, item 4). Each
# prints the output it finds (a word no program can compute: it is random) or "nothing"; both only read.
LEAKS = {
    "read other processes' command lines and environments": (
        "import glob, re\nfound = b'nothing'\n"
        "for p in glob.glob('/proc/[0-9]*/cmdline') + glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n        m = re.search(rb'\"outputs\": \\[\"(leak\\w+)\"', open(p, 'rb').read(1 << 16))\n"
        "    except OSError:\n        continue\n"
        "    found = m.group(1) if m else found\n"
        "print(found.decode())"
    ),
    "open data files found on the host": (  # named on a command line, or where data sits: cwd, home, tmp
        "import glob, os, re\npaths = {{{data!r}}}\n"
        "for p in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n        args = open(p, 'rb').read(1 << 16).decode('utf-8', 'replace').split('\\0')\n"
        "    except OSError:\n        continue\n"
        "    paths.update(a.split('=')[-1] for a in args if a.endswith('.jsonl'))\n"
        "for d in ('.', os.path.expanduser('~'), '/tmp', '/tmp/*', '/root', '/work/*'):\n"
        "    paths.update(glob.glob(d + '/*.jsonl'))\n"
        "found = 'nothing'\n"
        "for p in sorted(paths):\n"
        '    try:\n        m = re.search(r\'"outputs": \\["(leak\\w+)"\', open(p).read(1 << 20))\n'
        "    except (OSError, ValueError):\n        continue\n"
        "    found = m.group(1) if m else found\n"
        "print(found)"
    ),
}


@pytest.fixture(scope="module")
def host_truth():
    """A row's expected output on another process's command line and in its environment (as in ``armor reward
    code --ground-truth ...``), and in a world-readable data file that command line names."""
    truth = {"inputs": ["2\n"], "outputs": ["leak" + secrets.token_hex(6)]}
    data = Path(__file__).parent / f"armor-code-host-{secrets.token_hex(4)}.jsonl"  # beside the code, as data sits
    data.write_text(json.dumps({"prompt": "", "data_source": "code", "ground_truth": truth}) + "\n")
    data.chmod(0o644)
    argv = [sys.executable, "-c", "import time; time.sleep(300)", "--ground-truth", json.dumps(truth), f"data={data}"]
    decoy = subprocess.Popen(argv, env={"ARMOR_GROUND_TRUTH": json.dumps(truth)})
    try:
        yield truth, str(data)
    finally:
        decoy.kill()
        decoy.wait()
        data.unlink()


@pytest.mark.parametrize("name", LEAKS)
def test_a_program_cannot_read_the_expected_output_from_the_host(name, mode, host_truth):
    truth, data = host_truth
    result = code_reward("", f"```python\n{LEAKS[name].format(data=data)}\n```", truth, {}, **LIMITS)
    if (
        mode == "unconfined"
    ):  # the program finds it (where the file's directories let others in): not isolated, says the run
        reachable = all(p.stat().st_mode & 0o001 for p in Path(data).parents)
        assert result.score == float(reachable or "command lines" in name) and result.sub_scores["isolated"] == 0.0
    else:
        assert result.score == 0.0 and result.sub_scores["isolated"] == 1.0, result


def test_an_honest_program_passes_under_the_same_limits(mode):
    # the attacks fail because of the sandbox, not because these limits fail everything
    for truth, program in (
        (STDIO, "print(int(input()) ** 2)"),
        (CALL, "def f(x):\n    return x * x"),
        (CHECK, "def f(x):\n    return x * x"),
    ):
        assert code_reward("", f"```python\n{program}\n```", truth, {}, **LIMITS).score == 1.0


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_runs_as_an_unprivileged_user_when_started_as_root(mode):
    truth = {"inputs": [""], "outputs": ["ok"]}
    program = "import os\nprint('ok' if os.getuid() != 0 and not os.access('/root', os.W_OK) else 'root')"
    assert code_reward("", f"```python\n{program}\n```", truth, {}, **LIMITS).score == 1.0


def _score(program, truth):
    return code_reward("", f"```python\n{program}\n```", truth, {}, **LIMITS).score


NETWORK = ("import socket\nprint(sorted(n for _, n in socket.if_nameindex()))", {"inputs": [""], "outputs": ["['lo']"]})


def test_no_network_interface_but_a_loopback(mode):
    if mode != "namespaces":
        pytest.skip("the host's interfaces stay visible without a network namespace")
    assert _score(*NETWORK) == 1.0  # the host has more interfaces; the sandbox's namespace has only lo


def test_without_any_confinement_the_run_says_so_and_require_isolation_refuses(confine):
    confine(sandbox.Confinement(False, False, False, why="namespaces: refused"))
    result = code_reward("", "```python\nprint(int(input()) ** 2)\n```", STDIO, {}, **LIMITS)
    assert result.score == 1.0 and result.sub_scores["isolated"] == 0.0
    with pytest.raises(RuntimeError, match=r"refuses the confinements a run needs \(namespaces: refused\)"):
        code_reward("", "```python\nprint(4)\n```", STDIO, {}, **LIMITS, require_isolation=True)


def test_landlock_or_seccomp_alone_is_not_isolation():
    assert not sandbox.Confinement(False, True, False).isolated
    assert not sandbox.Confinement(False, False, True).isolated
    assert sandbox.Confinement(False, True, True).isolated and sandbox.Confinement(True, False, False).isolated


def test_an_ordinary_user_gets_the_same_sandbox(mode, host_truth, as_nobody):
    # most users are not root: no uid to drop to, a user namespace (or seccomp and Landlock) confines the program
    truth, data = host_truth

    def checks():
        failed = [name for name, ok in _ordinary_checks(mode, truth, data).items() if not ok]
        box = domain._sandbox(domain.Limits(memory_mb=256, processes=16), False, None)
        if mode == "namespaces" and not box.confinement.namespaces:
            return f"skip: {box.confinement.why}"
        return ", ".join(failed)

    said = as_nobody(checks)
    if said.startswith("skip: "):
        pytest.skip(f"this kernel refuses an ordinary user the namespaces: {said[6:]}")
    assert said == ""


def _ordinary_checks(mode, truth, data):
    network = mode == "unconfined" or _score(*ATTACKS["socket connect"]) == 0.0
    return {
        "honest": _score("print(int(input()) ** 2)", STDIO) == 1.0,
        "attacks": [
            _score(*ATTACKS[n]) for n in ("fork bomb", "environment secrets", "read the tests from disk or /proc")
        ]
        == [0.0, 0.0, 0.0],
        "network": network and (mode != "namespaces" or _score(*NETWORK) == 1.0),
        "host": mode == "unconfined" or [_score(p.format(data=data), truth) for p in LEAKS.values()] == [0.0, 0.0],
    }


def test_a_confinement_refused_after_the_probe_is_dropped_for_the_next_runs_and_said(monkeypatch):
    # the kernel granted namespaces when the sandbox was made, then refuses them in a run's child
    granted = sandbox.probe_confinement()
    if not (granted.network and granted.files):
        pytest.skip(f"needs seccomp and Landlock to fall back on: {granted.why}")
    box = sandbox.LocalSandbox()
    box.confinement = dataclasses.replace(granted, namespaces=True)

    def refused(user):
        raise PermissionError(1, "Operation not permitted", "unshare")

    monkeypatch.setattr(sandbox, "unshare_run", refused)  # the forked child runs this module's code
    result = code_reward_with(box, "print(int(input()) ** 2)")
    assert result.score == 1.0 and result.sub_scores["isolated"] == 1.0  # seccomp and Landlock carry on
    assert not box.confinement.namespaces and "namespaces: PermissionError" in box.confinement.why
    box.confinement = sandbox.Confinement(False, False, False)
    monkeypatch.setattr(sandbox, "block_network", lambda: None)
    monkeypatch.setattr(sandbox.resource, "setrlimit", lambda *a: (_ for _ in ()).throw(OSError(22, "no")))
    with pytest.raises(RuntimeError, match=r"a run could not start: limits: OSError"):
        code_reward_with(box, "print(4)")


def code_reward_with(box, program):
    monkey = pytest.MonkeyPatch()
    monkey.setattr(domain, "_sandbox", lambda *a: box)
    try:
        return code_reward("", f"```python\n{program}\n```", STDIO, {}, **LIMITS)
    finally:
        monkey.undo()
