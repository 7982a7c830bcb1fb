"""The harness that runs inside the sandbox: standard library only, started as ``python -I -S -c <this source>``.

It reads length-prefixed JSON frames on fd 0 and writes one frame of results on fd 1. The program under
test never runs in the harness's process: each test case runs in a forked child whose fds 0-2 are its own
(its stdin, a pipe for its stdout, /dev/null or a pipe for stderr), every other fd closed before any
program code runs, so the child cannot write the harness's result frame. What makes a case pass is
decided by the parent (``domain.py``) on the data sent back here: a stdio case's stdout, a call's return
value encoded by ``encode`` (exact builtin types only, never the program's ``__eq__``). Expected outputs
never enter the sandbox, except for assertion programs (HumanEval ``check``): their frame (the second)
is read only after every worker was forked, so no program's memory holds it, and the harness marks
itself non-dumpable so a same-uid program cannot read it from ``/proc/<pid>/mem`` either.
"""

import builtins
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

MAX_DEPTH = 50
_SCALARS = (type(None), bool, int, str)


def encode(x, depth=0):
    """Plain data as JSON with tags; anything but an exact builtin type raises TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if t in _SCALARS:
        return x
    if t is float:
        return x if x == x and x not in (float("inf"), float("-inf")) else {"f": repr(x)}
    if t is list:
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"s": [encode(v, depth + 1) for v in x]}
    if t is bytes:
        return {"b": x.hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise TypeError(f"a {t.__name__} is not plain data (int, float, str, list, tuple, dict, set, bytes, None)")


def decode(x):
    if isinstance(x, list):
        return [decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    ((tag, v),) = x.items()
    if tag == "f":
        return float(v)
    if tag == "t":
        return tuple(decode(i) for i in v)
    if tag == "d":
        return {_hashable(decode(k)): decode(i) for k, i in v}
    if tag == "s":
        return frozenset(_hashable(decode(i)) for i in v)
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "c":
        return complex(*v)
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(x):
    return tuple(_hashable(v) for v in x) if isinstance(x, list) else x


def frame(obj):
    data = json.dumps(obj).encode()
    return b"%016d" % len(data) + data


def _read_exact(fd, n, deadline=None):
    out = b""
    while len(out) < n:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def read_frame(fd, deadline=None):
    # exact reads, no buffering: bytes after this frame stay in the pipe, not in a forked child's memory
    return json.loads(_read_exact(fd, int(_read_exact(fd, 16, deadline)), deadline))


def _no_dump():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:
        pass


def _enter_child(fds, cpu_s):
    """In a forked child, before any program code: own process group, fds 0-2 only, a CPU limit."""
    import fcntl

    os.setpgid(0, 0)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]  # no clobbering while moving
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)


def _run_module(code, name):
    g = {"__name__": name, "__builtins__": builtins}
    exec(code, g)
    return g


def _finish(rc):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(rc)


def _stdio_child(code, argv):
    if argv:
        os.execvp(argv[0], argv)
    rc = 0
    try:
        _run_module(code, "__main__")
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc(limit=-2)  # the program's innermost frames, not the harness's
        rc = 1
    _finish(rc)


def _wait(pid, deadline):
    """(exit status or None on timeout, CPU seconds the child used); its process group is killed either way."""
    status, cpu_s = None, 0.0
    while status is None and time.monotonic() < deadline:
        done, wait_status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            status, cpu_s = wait_status, usage.ru_utime + usage.ru_stime
        else:
            time.sleep(0.002)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if status is None:
        os.waitpid(pid, 0)
    return status, cpu_s


def _outcome(status, timed_out, seconds, cpu_s, used):
    if timed_out or status is None:
        return {"status": "timeout", "seconds": seconds}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        # the CPU limit: SIGXCPU, then SIGKILL a second later; any other SIGKILL came from the program itself
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and used >= cpu_s):
            return {"status": "timeout", "seconds": seconds}
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return {"status": "error", "exit_code": -sig, "error": f"killed by {name}", "seconds": seconds}
    code = os.waitstatus_to_exitcode(status)
    return {"status": "ok" if code == 0 else "error", "exit_code": code, "seconds": seconds}


def run_stdio(cfg, code, stdin_text, deadline):
    start = time.monotonic()
    inp = os.memfd_create("stdin")
    os.write(inp, stdin_text.encode())
    os.lseek(inp, 0, 0)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _enter_child((inp, out_w, err_w), cfg["cpu_s"])
        _stdio_child(code, cfg.get("argv"))
    for fd in (inp, out_w, err_w):
        os.close(fd)
    out, open_fds, over = [b"", b""], [out_r, err_r], False
    while open_fds and time.monotonic() < deadline and not over:
        ready = select.select(open_fds, [], [], max(0.0, deadline - time.monotonic()))[0]
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
            elif fd == out_r:
                out[0] += chunk
                over = len(out[0]) > cfg["max_output"]
            elif len(out[1]) < 2000:
                out[1] += chunk
    timed_out = bool(open_fds) and not over
    status, used = _wait(pid, deadline if not open_fds else time.monotonic())
    os.close(out_r)
    os.close(err_r)
    result = _outcome(status, timed_out, time.monotonic() - start, cfg["cpu_s"], used)
    if over:
        result["status"] = "error"
        result["error"] = f"output over {cfg['max_output']} bytes"
    result["stdout"] = out[0][: cfg["max_output"]].decode("utf-8", "replace")
    if result["status"] == "error":
        result.setdefault("error", "".join(out[1].decode("utf-8", "replace").strip().splitlines()[-1:]))
    if cfg.get("stderr"):  # the python tool shows it to the policy; rewards never look at it
        result["stderr"] = out[1].decode("utf-8", "replace")
    return result


def _resolve(g, name):
    if name in g and callable(g[name]):
        return g[name]
    cls = g.get("Solution")  # LeetCode style: class Solution with the method
    if isinstance(cls, type) and hasattr(cls, name):
        return getattr(cls(), name)
    raise NameError(f"the program defines no function {name!r}")


class Worker:
    """A forked child that runs the program once and answers calls of its entry point over a pipe pair."""

    def __init__(self, cfg, code):
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            _enter_child((null, null, null, req_r, rep_w), cfg["cpu_s"])  # every other fd closed
            self._serve(cfg, code)
        os.close(req_r)
        os.close(rep_w)

    @staticmethod
    def _serve(cfg, code):
        g = None
        while True:
            try:
                request = read_frame(3)
            except Exception:
                _finish(0)
            try:
                if g is None:
                    g = _run_module(code, "__solution__")
                fn = _resolve(g, request.get("fn") or cfg["fn_name"])  # the entry point, or a helper a test names
                value = fn(*[decode(a) for a in request["args"]])
                reply = {"value": encode(value)}
            except BaseException as e:  # noqa: B036 - a program's SystemExit is its failure, not ours
                reply = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            os.write(4, frame(reply))

    def call(self, args, deadline, fn=None):
        os.write(self.req_w, frame({"args": encode(list(args)), "fn": fn}))
        reply = read_frame(self.rep_r, deadline)
        if "error" in reply:
            raise CandidateError(reply["error"])
        return decode(reply["value"])

    def close(self):
        for fd in (self.req_w, self.rep_r):
            os.close(fd)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(self.pid, 0)


class CandidateError(Exception):
    pass


class CaseTimeout(BaseException):
    """A BaseException, so that a test's ``except Exception`` cannot swallow it."""


def run_call(worker, args, deadline):
    start = time.monotonic()
    try:
        value = worker.call(args, deadline)
    except (TimeoutError, EOFError) as e:
        return {"status": "timeout" if isinstance(e, TimeoutError) else "error", "seconds": time.monotonic() - start}
    except CandidateError as e:
        return {"status": "error", "error": str(e), "seconds": time.monotonic() - start}
    return {"status": "ok", "value": encode(value), "seconds": time.monotonic() - start}


class _TestGlobals(dict):
    """A test's namespace. A name it neither defines nor finds among the builtins is taken for one of the
    program's own functions (HumanEval's ``poly``, ``encode_cyclic``), called in the program's process like
    the entry point, so plain data alone crosses back, as in the test suites that run program and test in
    one namespace."""

    def __init__(self, proxy, **names):
        super().__init__(**names)
        self._proxy = proxy

    def __missing__(self, name):
        if name in _BUILTIN_NAMES:
            return getattr(builtins, name)
        return self._proxy(name)


_BUILTIN_NAMES = set(dir(builtins))


def run_assert(worker, test, secret, deadline):
    start = time.monotonic()

    def proxy(name):
        def call(*args):
            try:
                return worker.call(args, deadline, fn=name)
            except TimeoutError:
                raise CaseTimeout from None
            except EOFError:
                raise CandidateError("the program's process died") from None

        return call

    candidate = proxy(None)
    ns = _TestGlobals(proxy, __name__="__test__", candidate=candidate)
    ns[secret["entry_point"]] = candidate
    try:
        exec(secret.get("setup") or "", ns)
        exec(test, ns)
        if "check" in ns and secret.get("check"):
            ns["check"](candidate)
    except CaseTimeout:
        return {"status": "timeout", "seconds": time.monotonic() - start}
    except BaseException as e:  # noqa: B036 - a failed assertion or any error fails the case
        return {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"status": "ok", "passed": True, "seconds": time.monotonic() - start}


def main():
    _no_dump()
    cfg = read_frame(0)
    try:
        code = compile(cfg["source"], "solution.py", "exec") if not cfg.get("argv") else None
        if cfg.get("argv"):  # another language: the program is a file in the scratch directory
            with open(cfg["filename"], "w") as f:
                f.write(cfg["source"])
            cfg["argv"] = [a.replace("{file}", cfg["filename"]) for a in cfg["argv"]]
    except (SyntaxError, ValueError) as e:
        os.write(1, frame({"compiled": False, "error": f"{type(e).__name__}: {e}", "cases": []}))
        return
    total_deadline = time.monotonic() + cfg["total_s"]
    mode, cases = cfg["mode"], []
    # assertion mode: fork one worker per test BEFORE reading the tests, so no program's memory holds them
    workers = [Worker(cfg, code) for _ in range(cfg["n_cases"])] if mode == "assert" else []
    secret = read_frame(0) if mode == "assert" else {}
    for i in range(cfg["n_cases"]):
        now = time.monotonic()
        if now >= total_deadline:
            cases.append({"status": "timeout", "seconds": 0.0, "skipped": True})
            continue
        deadline = min(now + cfg["timeout_s"], total_deadline)
        if mode == "stdio":
            cases.append(run_stdio(cfg, code, cfg["inputs"][i], deadline))
        elif mode == "call":
            worker = Worker(cfg, code)
            cases.append(run_call(worker, decode(cfg["inputs"][i]), deadline))
            worker.close()
        else:
            cases.append(run_assert(workers[i], secret["tests"][i], secret, deadline))
        if workers:
            workers[i].close()
    for w in workers[len(cases) :]:
        w.close()
    os.write(1, frame({"compiled": True, "cases": cases}))


if __name__ == "__main__":
    main()
