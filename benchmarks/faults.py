"""Reliability: the faults a hostile but fair user can cause, each tried on the real thing, and what
ARMOR does, printed as a markdown table (the table in docs/reliability.md is this script's output).

    python benchmarks/faults.py                  # every case: 3 short training runs and ~60 quick ones
    python benchmarks/faults.py --only model     # the cases whose name contains "model"
    python benchmarks/faults.py --list

A case runs ``armor run ...`` (or another command: ``eval``, ``export``, ``sft``, ``new``, ...) as a user
would (a subprocess: the table shows its exit code and the first line of its error or warning), or, for a fault the command line cannot make (a full disk, a
socket that never answers, a domain returning a score outside its range, a checkpoint damaged in
each of the ways ``--resume`` must survive), calls the component the trainer calls and shows what it
raised or warned. Training runs use the built-in tiny model for a few steps on CPU. Scratch files go
to a temporary directory (``--keep DIR`` keeps them in DIR).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from armor_core.testing.damage import CHECKPOINT_DAMAGE, add_own_code, flipped_checkpoint, write_adapter

SMALL = [
    "data.train_size=64",
    "data.val_size=8",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=4",
    "trainer.loggers=[jsonl]",
    "engine.cpus_per_worker=1",
]
_SHOWN = 180  # characters of a message the table shows


@dataclass
class Outcome:
    happened: str  # what the table's "what happens" column shows
    ok: bool


@dataclass(frozen=True)
class Case:
    name: str
    fault: str
    expected: str
    run: Callable[[Lab], Outcome]
    trains: bool = False  # starts workers: a minute or more, where the other cases take seconds


class Lab:
    """Scratch space, and the run directory with checkpoints that several cases share."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run_dir = root / "run"  # the killed run, resumed; then the run-directory and checkpoint cases' subject

    def relative(self, text: str) -> str:
        """``text`` with scratch paths made relative to the scratch directory, as the table shows them."""
        return text.replace(f"{self.root}/", "").replace(str(self.root), ".")

    def armor(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return self.command("run", *args, timeout=timeout)

    def command(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """``armor <args>``; no GPU is visible to it, so the cases read the same on any machine."""
        return subprocess.run(
            [sys.executable, "-m", "armor_core.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )

    def model(self, name: str, damage: Callable[[Path], Any]) -> Path:
        """A copy of the built-in model, damaged by ``damage(directory)``."""
        from armor_core.models.loading import resolve_model_path

        d = self.root / "models" / name
        shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), d)
        damage(d)
        return d

    def data(self, name: str, content: bytes) -> Path:
        path = self.root / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return path

    def trained(self) -> Path:
        """A run directory holding checkpoints: the training cases' one, or a 3-step run made now."""
        if not (self.run_dir / "checkpoints" / "latest").exists():
            proc = self.armor(*SMALL, "trainer.total_steps=3", "trainer.save_freq=1", f"trainer.run_dir={self.run_dir}")
            if proc.returncode != 0:
                raise RuntimeError(f"the run every run-directory case needs failed:\n{proc.stderr[-3000:]}")
        return self.run_dir


# -- what a case saw ------------------------------------------------------------------------------


def message(stderr: str) -> str:
    """The line a user reads: the CLI's error, else a crash's last line (marked), else a checkpoint warning, else the
    last line.

    A logged traceback is not a crash: the reward manager logs a failing domain's own traceback once.
    """
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    if errors:
        return errors[0]
    last = stderr.strip().splitlines()[-1:] or [""]
    if "Traceback (most recent call last)" in stderr:
        return "traceback: " + last[0]
    return (re.findall(r"CheckpointWarning: (.*)", stderr) or last)[0]


def shown(text: str) -> str:
    text = " ".join(text.split())
    return (text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...").replace("|", "\\|")


def cli(args: Callable[[Lab], list[str]], code: int, pattern: str, command: str = "run") -> Callable[[Lab], Outcome]:
    """A case that runs ``armor <command> <args>`` and expects exit ``code`` and a message matching ``pattern``."""

    def run(lab: Lab) -> Outcome:
        proc = lab.command(*([command] if command else []), *args(lab))
        said = lab.relative(message(proc.stderr))
        one_line = sum(line.startswith("error: ") for line in proc.stderr.splitlines()) <= 1
        return Outcome(
            f"exit {proc.returncode}: {shown(said)}",
            proc.returncode == code and one_line and bool(re.search(pattern, said)),
        )

    return run


def refused(what: str, extra: Callable[[Lab], list[str]], pattern: str) -> Case:
    """``armor run`` with a bad input: exit 2 and one line naming it, before any worker starts."""
    return Case(
        what,
        what,
        "exit 2, one line naming it",
        cli(lambda lab: [*extra(lab), f"trainer.run_dir={lab.root / 'refused'}"], 2, pattern),
    )


def refused_command(what: str, argv: Callable[[Lab], list[str]], pattern: str) -> Case:
    """``armor <argv>`` (any command) with a bad input: exit 2 and one line naming it."""
    return Case(what, what, "exit 2, one line naming it", cli(argv, 2, pattern, command=""))


# -- checkpoints and the disk (the component --resume calls) --------------------------------------


def damaged_checkpoint(damage: str) -> Callable[[Lab], Outcome]:
    def run(lab: Lab) -> Outcome:
        from armor_core.storage.checkpoint import CheckpointManager

        copy = lab.root / "ckpt" / re.sub(r"\W+", "_", damage)
        shutil.copytree(lab.trained() / "checkpoints", copy / "checkpoints")
        steps = sorted((copy / "checkpoints").glob("step_*"))
        rel, hurt = CHECKPOINT_DAMAGE[damage]
        hurt(steps[-1] / rel)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            latest = CheckpointManager(copy).latest()
        said = lab.relative(str(caught[0].message)) if caught else "no warning"
        return Outcome(
            f"resumes from {latest.name if latest else None}; warning: {shown(said)}",
            latest == steps[-2] and bool(caught) and rel in said,
        )

    return run


def disk_full(lab: Lab) -> Outcome:
    from armor_core.storage.checkpoint import CheckpointError, CheckpointManager

    ck = CheckpointManager(lab.root / "disk")
    ck.save(1, lambda d: (d / "w.txt").write_text("one"), {"step": 1})

    def full(d: Path) -> None:
        (d / "w.txt").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        ck.save(2, full, {"step": 2})
        return Outcome("saved?", False)
    except CheckpointError as e:
        kept = CheckpointManager(lab.root / "disk").latest()
        return Outcome(
            f"CheckpointError: {shown(lab.relative(str(e)))}",
            kept is not None and kept.name == "step_000001" and "is full" in str(e),
        )


# -- the channel and the reward domains (in-process: no command line makes these) -----------------


def silent_listener(lab: Lab) -> Outcome:
    import socket

    from armor_core.engine import channel

    saved, channel.HANDSHAKE_TIMEOUT_S = channel.HANDSHAKE_TIMEOUT_S, 1.0
    mute = socket.socket()  # the kernel completes the connection; nobody ever sends the challenge
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)
    t0 = time.monotonic()
    try:
        channel.connect(mute.getsockname(), b"k" * 32)
        return Outcome("connected?", False)
    except TimeoutError as e:
        waited = time.monotonic() - t0
        return Outcome(
            f"TimeoutError after {waited:.1f} s: {shown(str(e))}", waited < 10 and str(mute.getsockname()[1]) in str(e)
        )
    finally:
        channel.HANDSHAKE_TIMEOUT_S = saved
        mute.close()


def _loud(prompt: str, response: str, ground_truth: Any, extra: Any) -> float:
    return float(response)


def _as_text(prompt: str, response: str, ground_truth: Any, extra: Any) -> str:
    return response  # a bug: the score as text, which float() would read


def _nan_part(prompt: str, response: str, ground_truth: Any, extra: Any) -> Any:
    from armor_core import RewardResult

    return RewardResult(1.0, {"part": float("nan")})


def bad_score(response: str, fn: Callable[..., Any] = _loud) -> Callable[[Lab], Outcome]:
    def run(lab: Lab) -> Outcome:
        from armor_core import RewardDomain, hookimpl
        from armor_core.config.schema import RewardConfig
        from armor_core.plugins import PluginManager
        from armor_core.rewards.manager import RewardManager

        class Plugin:
            @hookimpl
            def armor_register_reward_domains(self, register):
                register("loud", RewardDomain(fn, requires_ground_truth=False, inline=True))

        pm = PluginManager(load_entrypoints=False, disabled=())
        pm.register(Plugin(), name="faults_benchmark")
        quiet = logging.getLogger("armor_core.rewards.manager")
        level, quiet.level = (
            quiet.level,
            logging.CRITICAL,
        )  # the failure's log entry (with its traceback) is not the table's
        try:
            batch = RewardManager(RewardConfig(failure_score=0.0), pm).score(["p"], [response], ["loud"], [None], None)
        finally:
            quiet.level = level
        return Outcome(
            f"row fails (scored reward.failure_score={batch.scores[0]:g}): {shown(batch.errors[0] or 'no error')}",
            batch.errors[0] is not None,
        )

    return run


def _refused_row(lab: Lab) -> Outcome:
    """``armor reward --input`` with a row whose ground truth the domain's check refuses: that row is malformed."""
    rows = lab.data("bad_gt.jsonl", b'{"response": "5", "ground_truth": "abc"}\n')
    proc = lab.command("reward", "arithmetic", "--input", str(rows))
    said = next((line for line in proc.stderr.splitlines() if "malformed row" in line), message(proc.stderr))
    return Outcome(
        f"exit {proc.returncode}: {shown(lab.relative(said))}",
        proc.returncode == 1
        and "Traceback" not in proc.stderr
        and re.search(r"bad_gt.jsonl:1: malformed row: reward domain 'arithmetic' cannot read", said) is not None,
    )


def _integer_only(ground_truth: Any) -> None:  # a first try: the row's extra is passed too, as a second argument
    int(ground_truth)


def _one_argument_check(lab: Lab) -> Outcome:
    """A reward domain whose ``validate_ground_truth`` takes only the ground truth, registered in-process."""
    from armor_core import RewardDomain, hookimpl
    from armor_core.plugins import PluginError, PluginManager

    class Plugin:
        @hookimpl
        def armor_register_reward_domains(self, register):
            register("num", RewardDomain(_loud, validate_ground_truth=_integer_only))

    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(Plugin(), name="authors_pack")
    try:
        pm.names("reward_domain")
        return Outcome("registered", False)
    except PluginError as e:
        said = str(e)
        return Outcome(
            f"PluginError: {shown(said)}",
            "plugin 'authors_pack'" in said and "validate_ground_truth(ground_truth, extra)" in said,
        )


# -- training runs ---------------------------------------------------------------------------------


def killed_worker(lab: Lab) -> Outcome:
    proc = lab.armor(
        *SMALL,
        "trainer.total_steps=3",
        "trainer.save_freq=1",
        f"trainer.run_dir={lab.run_dir}",
        "trainer.faults=[{kind: kill_worker, steps: [3]}]",
    )
    said = lab.relative(message(proc.stderr))
    return Outcome(f"exit {proc.returncode}: {shown(said)}", proc.returncode == 2 and "--resume" in said)


def resumed_past_damage(lab: Lab) -> Outcome:
    """--resume after the kill, with the newest checkpoint's weights truncated: back to the older one, steps replayed
    once."""
    if not (lab.run_dir / "checkpoints").is_dir():
        killed_worker(lab)
    newest = sorted((lab.run_dir / "checkpoints").glob("step_*"))[-1] / "model" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    proc = lab.armor(
        *SMALL, "trainer.total_steps=3", "trainer.save_freq=1", f"trainer.run_dir={lab.run_dir}", "--resume"
    )  # faults may change
    steps = [
        json.loads(line)["step"]
        for line in (lab.run_dir / "metrics.jsonl").read_text().splitlines()
        if "actor/pg_loss" in line
    ]
    said = lab.relative(message(proc.stderr))
    return Outcome(
        f"exit {proc.returncode}; warning: {shown(said)}; metrics.jsonl training steps {steps}",
        proc.returncode == 0 and "is damaged and is skipped" in said and steps == [1, 2, 3],
    )


def failing_domain(lab: Lab) -> Outcome:
    rows = "".join(
        json.dumps({"prompt": f"{i}+1=", "data_source": "gsm8k", "ground_truth": "forty"}) + "\n" for i in range(16)
    )
    train = lab.data("gsm8k_words.jsonl", rows.encode())
    proc = lab.armor(
        *SMALL, f"data.train_files=[{train}]", "trainer.total_steps=3", f"trainer.run_dir={lab.root / 'failing'}"
    )
    said = lab.relative(message(proc.stderr))
    return Outcome(
        f"exit {proc.returncode}: {shown(said)}",
        proc.returncode == 2 and "reward domain 'gsm8k' failed on 16 of its 16 rows" in said,
    )


def _row(**fields: Any) -> bytes:
    return json.dumps({"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": "2", **fields}).encode() + b"\n"


_ROW = _row()


def _train_file(name: str, content: bytes) -> Callable[[Lab], list[str]]:
    return lambda lab: [f"data.train_files=[{lab.data(name, content)}]"]


def _shard_without_second(d: Path) -> None:
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )


def _adapter(lab: Lab, name: str, damage: Callable[[Path], Any]) -> str:
    """A LoRA adapter of the built-in model, damaged by ``damage(directory)``."""
    d = write_adapter(lab.root / "adapters" / name)
    damage(d)
    return str(d)


_EVAL = ["--data", "task:arithmetic", "--size", "2"]


def _locked(lab: Lab) -> Outcome:
    from armor_core.storage.run_dir import RunDirLock

    with RunDirLock(lab.trained()):  # as a second `armor run` into the directory would meet the first
        return cli(
            lambda lab: [*SMALL, f"trainer.run_dir={lab.run_dir}", "--resume"], 2, r"is in use by another armor run"
        )(lab)


def _nan_weight(d: Path) -> None:
    """One NaN in the first tensor of a model directory's weights, as a diverged run leaves them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def _on_replaced_base(lab: Lab) -> str:
    """A LoRA adapter with its base recorded (as a LoRA run's checkpoint holds it), the base then retrained in place."""
    from safetensors.torch import load_file, save_file

    from armor_core.models.lora import write_base_manifest

    base = lab.model("replaced_base", lambda d: None)
    adapter = write_adapter(lab.root / "adapters" / "replaced_base")
    write_base_manifest(adapter, base)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(base)}))
    tensors = {k: v + 1e-3 for k, v in load_file(base / "model.safetensors").items()}  # same shapes, other weights
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    return str(adapter)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _silent_port(lab: Lab) -> int:
    """A local port where something accepts connections and never says a word (kept open while the script runs)."""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    held = []

    def accept() -> None:
        while True:
            held.append(sock.accept()[0])  # kept open, silent

    threading.Thread(target=accept, daemon=True).start()
    return sock.getsockname()[1]


def _resume_past_the_end(lab: Lab) -> Outcome:
    """``--resume`` of a finished run with its own length: exit 0 saying so, and no file of the run changes."""
    run = lab.trained()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    proc = lab.armor(*SMALL, "trainer.total_steps=3", "trainer.save_freq=1", f"trainer.run_dir={run}", "--resume")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    said = next((line for line in proc.stdout.splitlines() if line.startswith("--resume:")), message(proc.stderr))
    return Outcome(
        f"exit {proc.returncode}: {shown(lab.relative(said))}; files changed: {len(set(before.items()) ^ set(after.items()))}",
        proc.returncode == 0 and "nothing to train" in said and before == after,
    )


def _lora_resume_other_rank(lab: Lab) -> Outcome:
    """``--resume --allow-config-change model.lora_rank`` of a LoRA run with another rank: the actor worker refuses
    it in one line, and the run's config.json still holds the rank the run was trained with."""
    run = lab.root / "lora_run"
    lora = [*SMALL, "model.lora_rank=4", "trainer.total_steps=1", "trainer.save_freq=1", f"trainer.run_dir={run}"]
    trained = lab.armor(*lora)
    if trained.returncode != 0:
        return Outcome(f"the LoRA run to resume failed: {shown(message(trained.stderr))}", False)
    config = (run / "config.json").read_bytes()
    proc = lab.armor(*lora, "model.lora_rank=8", "trainer.total_steps=2", "--resume", "--allow-config-change",
                     "model.lora_rank")  # fmt: skip
    said = lab.relative(message(proc.stderr))
    kept = (run / "config.json").read_bytes() == config
    return Outcome(
        f"exit {proc.returncode}: {shown(said)}; config.json {'unchanged' if kept else '**rewritten**'}",
        proc.returncode == 2 and kept and "this run has model.lora_rank=8: resume with model.lora_rank=4" in said,
    )


# -- rewards, reward models, judges and teachers (issue 42) ---------------------------------------


def _leaving_file(lab: Lab) -> Path:
    """A reward file that calls sys.exit(0) as it is read."""
    return lab.data("leaves.py", b"import sys\n\nsys.exit(0)\n")


def _leaving_config(lab: Lab) -> Path:
    """A run config whose reward.custom names ``_leaving_file``."""
    return lab.data("leaves.yaml", f"reward:\n  custom:\n    - {{path: {_leaving_file(lab)}}}\n".encode())


def _huge_reward_json(lab: Lab) -> Outcome:
    """``armor reward`` on a file reward returning 1e39 (inf in float32): the row fails, and the line printed is
    JSON (``-Infinity`` is not)."""
    path = lab.data("huge.py", b"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                               b"    return 1e39\n")  # fmt: skip
    config = lab.data(
        "huge.yaml", f"reward:\n  custom:\n    - {{path: {path}, requires_ground_truth: false}}\n".encode()
    )
    proc = lab.command("reward", "huge", "--config", str(config), "--response", "x")
    try:
        record = json.loads(proc.stdout, parse_constant=lambda name: {"not JSON": name})
    except ValueError:
        record = {"not JSON": proc.stdout}
    error = record.get("error", "") if isinstance(record, dict) else ""
    return Outcome(
        f"exit {proc.returncode}: {shown(lab.relative(proc.stdout.strip()))}",
        proc.returncode == 1 and "not JSON" not in str(record) and "outside the float32 range" in error,
    )


def _trickling_service(lab: Lab) -> Outcome:
    """``reward.remote`` at a server that sends a byte every 0.2 s (timeout_s 1, retries 1, back-off 0.1): the rows
    fail within the batch's bound, 2.1 s (urllib's per-operation timeout never trips)."""
    import socket
    import threading

    from armor_core.config.schema import RewardConfig
    from armor_core.plugins import PluginManager
    from armor_core.rewards.manager import RewardManager

    listener = socket.create_server(("127.0.0.1", 0))

    def trickle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                for _ in range(100):  # 20 s, then it gives up
                    conn.sendall(b" ")
                    time.sleep(0.2)
            except OSError:
                return

    def serve() -> None:
        while True:
            try:
                threading.Thread(target=trickle, args=(listener.accept()[0],), daemon=True).start()
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    entry = {"url": f"http://127.0.0.1:{listener.getsockname()[1]}/r", "timeout_s": 1, "retries": 1, "backoff_s": 0.1}
    quiet = logging.getLogger("armor_core.rewards.manager")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        with RewardManager(RewardConfig(remote=entry, failure_score=0.0), PluginManager()) as manager:
            t0 = time.monotonic()
            batch = manager.score(["p"] * 2, ["a", "b"], ["remote"] * 2, [None] * 2)
            took = time.monotonic() - t0
    finally:
        quiet.level = level
        listener.close()
    return Outcome(
        f"{took:.1f} s; rows fail: {shown(batch.errors[0] or 'no error')}",
        took < 3.0 and all(batch.errors) and "TimeoutError" in (batch.errors[0] or ""),
    )


def _domain_map_to_file(lab: Lab) -> Outcome:
    """``reward.domain_map`` naming a domain ``reward.custom`` defines, weighted beside an installed one."""
    path = lab.data("mine.py", b"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                               b"    return 1.0\n")  # fmt: skip
    proc = lab.command(
        "run", *SMALL, f"reward.custom=[{{path: {path}, domain: mine}}]", "reward.domain_map.arithmetic={arithmetic: 1.0, mine: 0.5}",
        f"trainer.run_dir={lab.root / 'domain_map_dry'}", "--dry-run",
    )  # fmt: skip
    said = lab.relative(message(proc.stderr)) if proc.returncode else "config and plugins are valid"
    return Outcome(f"exit {proc.returncode}: {shown(said)}", proc.returncode == 0)


def _bigger_teacher(lab: Lab) -> Path:
    """A teacher with the built-in model's tokenizer and 13 more rows in its head (as Qwen2.5-7B has 128 more than
    0.5B)."""
    from armor_core.models.loading import build_tiny_model, load_tokenizer

    d = lab.root / "models" / "bigger_teacher"
    if not d.is_dir():
        build_tiny_model("qwen2", 19 + 13, hidden_size=64, num_layers=1, num_heads=2, seed=3).save_pretrained(d)
        load_tokenizer("builtin:arithmetic-tiny").save_pretrained(d)
    return d


def _bigger_teacher_run(lab: Lab) -> Outcome:
    run = lab.root / "bigger_teacher_run"
    proc = lab.armor(
        *SMALL, "trainer.total_steps=2", "trainer.val_freq=0", f"algorithm.distill.teacher={_bigger_teacher(lab)}",
        "algorithm.distill.mode=topk_forward_kl", "algorithm.distill.k=4", f"trainer.run_dir={run}",
    )  # fmt: skip
    steps = (
        [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] if proc.returncode == 0 else []
    )
    kl = [row["distill/reverse_kl"] for row in steps if "distill/reverse_kl" in row]
    said = f"{len(kl)} steps, distill/reverse_kl {kl[-1]:.3f}" if kl else shown(lab.relative(message(proc.stderr)))
    return Outcome(f"exit {proc.returncode}: {said}", proc.returncode == 0 and len(kl) == 2)


def _empty_weights(d: Path) -> None:
    (d / "model.safetensors").write_bytes(b"")


def _latin1_pairs(lab: Lab) -> Path:
    good = b'{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
    return lab.data("latin1_pairs.jsonl", good + good + b'{"prompt": "caf\xe9", "chosen": "2", "rejected": "3"}\n')


# -- multi-turn tools ----------------------------------------------------------------------------

_TOOLS_ON = [
    "rollout.multi_turn.enable=true",
    "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator']}",
]
_HOSTILE_TOOL = '''
import sys
import threading


def lookup(key: str, *, table: dict | None = None) -> str:
    """Read the value stored under a key.

    Args:
        key: the key to read, e.g. "alpha".
    """
    if key[:1] < "m":
        sys.exit(0)
    threading.Event().wait()
'''


def hostile_tool(lab: Lab) -> Outcome:
    """recipe:tools with its lookup replaced by one that calls sys.exit(0) on some keys and never returns on the
    others: the run finishes, and every call the policy made is an error it read."""
    (lab.root / "hostile_tools.py").write_text(_HOSTILE_TOOL)
    run_dir = lab.root / "hostile_tool"
    path = os.pathsep.join(p for p in (str(lab.root), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "armor_core.cli.main", "run", "recipe:tools", *SMALL[:4], "rollout.n=2",
         "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "trainer.total_steps=2", "trainer.val_freq=0",
         "trainer.val_before_train=false", "trainer.loggers=[jsonl]", f"trainer.run_dir={run_dir}",
         "rollout.multi_turn.environment_kwargs={tools: ['hostile_tools:lookup'], timeout_s: 1}"],
        capture_output=True, text=True, timeout=900, cwd=lab.root,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path},
    )  # fmt: skip
    if proc.returncode != 0 or not (run_dir / "summary.json").exists():
        return Outcome(f"exit {proc.returncode}, summary.json {'written' if (run_dir / 'summary.json').exists() else '**absent**'}: {shown(lab.relative(message(proc.stderr)))}", False)  # fmt: skip
    steps = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "actor/pg_loss" in line
    ]
    calls = sum(r["env/tool_calls"] for r in steps)
    errors = sum(r["env/tool_errors"] for r in steps)
    return Outcome(
        f"exit 0, summary.json written; training steps {[r['step'] for r in steps]}, tool calls per episode "
        f"{calls / max(len(steps), 1):.2f}, all errors the policy read: {errors == calls}",
        [r["step"] for r in steps] == [1, 2] and calls > 0 and errors == calls,
    )


def _next_step(lab: Lab) -> Outcome:
    """``armor new reward``: the printed next step installs the package with its test extra (``pip install -e .``
    alone has no pytest)."""
    proc = lab.command("new", "reward", "probe_next", "--out", str(lab.root / "new"))
    step = next((line.strip() for line in proc.stdout.splitlines() if "pip install" in line), "no pip install line")
    return Outcome(
        f"exit {proc.returncode}: {shown(lab.relative(step))}",
        proc.returncode == 0 and "pip install -e '.[test]'" in step and "python -m pytest" in step,
    )


def _chat_template_help(lab: Lab) -> Outcome:
    """``armor run --help-config``: model.path's help says which built-in model has a chat template."""
    proc = lab.command("run", "--help-config")
    said = re.search(r"builtin:[\w-]+ has an append-only chat template", proc.stdout)
    return Outcome(
        f"exit {proc.returncode}: {said.group(0) if said else 'no built-in model said to have a chat template'}",
        proc.returncode == 0 and said is not None and "have no chat template" in proc.stdout,
    )


def _dry_run_environment(lab: Lab) -> Outcome:
    """``armor run --dry-run`` with multi-turn on: the plan names the environment's class."""
    proc = lab.command("run", *SMALL, *_TOOLS_ON, f"trainer.run_dir={lab.root / 'dry_env'}", "--dry-run")
    line = next((x.strip() for x in proc.stdout.splitlines() if "rollout.multi_turn.environment:" in x), None)
    said = line or shown(lab.relative(message(proc.stderr)) or "no environment in the plan")
    return Outcome(f"exit {proc.returncode}: {said}", proc.returncode == 0 and line is not None and "Tools" in line)


CASES: list[Case] = [
    # config: every value is checked before anything starts
    refused(
        "config: rollout.temperature=nan",
        lambda lab: ["rollout.temperature=nan"],
        r"rollout.temperature=nan is not a finite number",
    ),
    refused("config: actor.lr=nan", lambda lab: ["actor.lr=nan"], r"actor.lr=nan is not a finite number"),
    refused("config: actor.betas=[0.9]", lambda lab: ["actor.betas=[0.9]"], r"actor.betas=\[0.9\] has 1 item"),
    refused(
        "config: trainer.total_epochs=-1",
        lambda lab: ["trainer.total_epochs=-1"],
        r"trainer.total_epochs=-1 is out of range",
    ),
    refused("config: trainer.seed=-1", lambda lab: ["trainer.seed=-1"], r"trainer.seed=-1 is out of range"),
    refused(
        "config: an override that is not YAML (guard.guards=[{name:grad_spike,params:{window:0}}])",
        lambda lab: ["guard.guards=[{name:grad_spike,params:{window:0}}]"],
        r"not valid YAML",
    ),
    refused(
        "guard: a parameter the guard refuses (grad_spike window=0)",
        lambda lab: ["guard.guards=[{name: grad_spike, params: {window: 0}}]"],
        r"guard.guards\[0\].*window=0 must be >= 1",
    ),
    refused(
        "guard: an unknown guard parameter",
        lambda lab: ["guard.guards=[{name: grad_spike, params: {windw: 3}}]"],
        r"unexpected keyword argument 'windw'",
    ),
    refused(
        "task: a parameter the task refuses (data.task_kwargs={digits: 0})",
        lambda lab: ["data.task_kwargs={digits: 0}"],
        r"data.task=arithmetic.*digits",
    ),
    # data files
    refused(
        "data: a JSONL line that is not UTF-8",
        _train_file("latin1.jsonl", _ROW + '{"prompt": "café"}'.encode("latin-1")),
        r"latin1.jsonl, line 2: not UTF-8",
    ),
    refused(
        "data: a .parquet file that is not Parquet", _train_file("fake.parquet", b"prompt,answer"), r"fake.parquet"
    ),
    refused(
        "data: a missing data file",
        lambda lab: [f"data.train_files=[{lab.root / 'nowhere.jsonl'}]"],
        r"nowhere.jsonl' does not exist",
    ),
    refused(
        "reward: a dict ground truth for the math domain",
        _train_file("dict_gt.jsonl", _row(data_source="math", ground_truth={"answer": "4"})),
        r"dict_gt.jsonl, line 1: reward domain 'math' cannot read this ground_truth",
    ),
    # model files: found in the driver, before any worker starts
    refused(
        "model: a hub name, not a local directory",
        lambda lab: ["model.path=Qwen/Qwen2.5-0.5B"],
        r"does not exist.*never downloads",
    ),
    refused(
        "model: truncated model.safetensors",
        lambda lab: [
            f"model.path={lab.model('truncated', lambda d: (d / 'model.safetensors').write_bytes((d / 'model.safetensors').read_bytes()[:6000]))}"
        ],
        r"truncated/model.safetensors: tensor",
    ),
    refused(
        "model: missing config.json",
        lambda lab: [f"model.path={lab.model('no_config', lambda d: (d / 'config.json').unlink())}"],
        r"no_config' has no config.json",
    ),
    refused(
        "model: an index naming a missing shard",
        lambda lab: [f"model.path={lab.model('sharded', _shard_without_second)}"],
        r"index.json names the shard 'model-00002-of-00002.safetensors'",
    ),
    refused(
        "model: a corrupt tokenizer.json",
        lambda lab: [f"model.path={lab.model('bad_tok', lambda d: (d / 'tokenizer.json').write_text('{'))}"],
        r"bad_tok/tokenizer.json is not valid JSON",
    ),
    refused(
        "model: a directory only its own code can load (config.json auto_map)",
        lambda lab: [f"model.path={lab.model('own_code', add_own_code)}"],
        r"modeling_probe.py.*set model.trust_remote_code=true",
    ),
    # the run's resources, interpolations, trackers
    refused(
        "engine: engine.cpus_per_worker=4096",
        lambda lab: ["engine.cpus_per_worker=4096"],
        r"not enough CPU cores.*engine.cpus_per_worker",
    ),
    refused(
        "engine: engine.gpus_per_worker=1 with no GPU visible",
        lambda lab: ["engine.gpus_per_worker=1"],
        r"not enough GPUs.*engine.gpus_per_worker",
    ),
    refused(
        "config: a self-referential interpolation (trainer.project_name=${trainer.project_name})",
        lambda lab: ["trainer.project_name=${trainer.project_name}"],
        r"trainer.project_name: Recursive interpolation",
    ),
    Case(
        "run_dir a file",
        "`armor run` with trainer.run_dir naming a file",
        "exit 2, one line naming it",
        cli(
            lambda lab: [*SMALL, f"trainer.run_dir={lab.data('run_dir.txt', b'')}"],
            2,
            r"run_dir.txt is not a directory",
        ),
    ),
    refused(
        "config: a tracker named twice (trainer.loggers=[jsonl,jsonl])",
        lambda lab: ["trainer.loggers=[jsonl,jsonl]"],
        r"names jsonl more than once",
    ),
    refused(
        "data: a directory as a data file",
        lambda lab: [f"data.train_files=[{lab.data('x.jsonl', _ROW).parent}]"],
        r"data' is a directory",
    ),
    # the other commands: the same rule
    refused_command(
        "new: a name whose module is ARMOR's (armor new guard core)",
        lambda lab: ["new", "guard", "core", "--out", str(lab.root / "new")],
        r"its module 'armor_core' is already importable",
    ),
    refused_command(
        "new: a name whose distribution is ARMOR's (armor new estimator rl)",
        lambda lab: ["new", "estimator", "rl", "--out", str(lab.root / "new")],
        r"its distribution 'armor-rl' is already installed",
    ),
    refused_command(
        "new: a name that is no PEP 508 project name (armor new guard _)",
        lambda lab: ["new", "guard", "_", "--out", str(lab.root / "new")],
        r"'_' is not lowercase snake_case",
    ),
    refused_command(
        "new: a 300-character name",
        lambda lab: ["new", "guard", "a" * 300, "--out", str(lab.root / "new")],
        r"has 300 characters; at most 64",
    ),
    refused_command(
        "plugins: an unknown kind (armor plugins --kind nosuch)",
        lambda lab: ["plugins", "--kind", "nosuch"],
        r"--kind nosuch: no such kind",
    ),
    refused_command(
        "eval: --max-new-tokens 0",
        lambda lab: ["eval", "builtin:arithmetic-tiny", *_EVAL, "--max-new-tokens", "0"],
        r"--max-new-tokens 0: a response needs at least 1 token",
    ),
    refused_command(
        "eval: a model directory only its own code can load",
        lambda lab: ["eval", str(lab.model("own_code_eval", add_own_code)), *_EVAL],
        r"set model.trust_remote_code=true \(armor eval.*--trust-remote-code\)",
    ),
    refused_command(
        "eval: a truncated adapter",
        lambda lab: [
            "eval",
            _adapter(lab, "trunc", lambda d: (d / "adapter_model.safetensors").write_bytes(b"\x00" * 100)),
            *_EVAL,
        ],
        r"trunc/adapter_model.safetensors",
    ),
    refused_command(
        "eval: an adapter_config.json that is not JSON",
        lambda lab: ["eval", _adapter(lab, "bad_cfg", lambda d: (d / "adapter_config.json").write_text("{")), *_EVAL],
        r"bad_cfg/adapter_config.json is not valid JSON",
    ),
    refused_command(
        "eval: a checkpoint whose weights fail its manifest (one flipped byte)",
        lambda lab: ["eval", str(flipped_checkpoint(lab.root / "eval_ckpt") / "model"), *_EVAL],
        r"is damaged: model/model.safetensors does not match the sha256",
    ),
    refused_command(
        "export: a checkpoint whose weights fail its manifest (one flipped byte)",
        lambda lab: ["export", str(flipped_checkpoint(lab.root / "export_ckpt")), str(lab.root / "exported")],
        r"is damaged: model/model.safetensors does not match the sha256",
    ),
    refused_command(
        "export --merge: a LoRA checkpoint whose adapter fails its manifest",
        lambda lab: [
            "export",
            str(flipped_checkpoint(lab.root / "merge_ckpt", lora=True)),
            str(lab.root / "merged"),
            "--merge",
        ],
        r"is damaged: adapter/adapter_model.safetensors does not match the sha256",
    ),
    refused_command(
        "sft: --out names a file",
        lambda lab: ["sft", "--init", "tiny-qwen2", "--out", str(lab.data("notes.txt", b"")), "--steps", "1"],
        r"notes.txt is a file; give a directory",
    ),
    refused_command(
        "sft: --data names a directory",
        lambda lab: [
            "sft",
            "--init",
            "tiny-qwen2",
            "--data",
            str(lab.data("x.jsonl", _ROW).parent),
            "--out",
            str(lab.root / "sft_dir_out"),
        ],
        r"--data file '.*data' is a directory; give a JSONL file",
    ),
    refused_command(
        "sft: a truncated model",
        lambda lab: [
            "sft",
            "--model",
            str(lab.model("sft_trunc", lambda d: (d / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 99))),
            "--out",
            str(lab.root / "sft_out"),
        ],
        r"sft_trunc/model.safetensors",
    ),
    refused_command(
        "reward: an empty --ground-truth (armor reward math)",
        lambda lab: ["reward", "math", "--response", "\\boxed{2}", "--ground-truth", ""],
        r"requires --ground-truth \(got an empty one; training refuses such a row too\)",
    ),
    # training runs: a worker killed, a resume past a damaged checkpoint, a reward domain failing on every row
    Case(
        "kill -9",
        "kill -9 of the actor worker during step 3 (trainer.faults kill_worker)",
        "exit 2 naming the worker; checkpoints kept",
        killed_worker,
        trains=True,
    ),
    Case(
        "resume damaged",
        "--resume after that kill, the newest checkpoint's weights truncated",
        "exit 0: older checkpoint, warning naming the file, no duplicate metrics rows",
        resumed_past_damage,
        trains=True,
    ),
    Case(
        "failing domain",
        "a reward domain failing on every row (gsm8k, ground truths in words)",
        "exit 2 naming the domain, at step 1",
        failing_domain,
        trains=True,
    ),
    # resume, engine, sampling and LoRA checks (issue 33)
    Case(
        "lora resume rank",
        "--resume of a LoRA run (rank 4) with --allow-config-change model.lora_rank and model.lora_rank=8",
        "exit 2, one line naming the rank; config.json unchanged",
        _lora_resume_other_rank,
        trains=True,
    ),
    refused(
        "config: a mask-mode rollout correction capped below 1",
        lambda lab: ["algorithm.rollout_correction=mask_token", "algorithm.rollout_correction_cap=0.5"],
        r"algorithm.rollout_correction_cap=0.5 with algorithm.rollout_correction=mask_token: .*set the cap to 1",
    ),
    refused(
        "model: a NaN in the weights",
        lambda lab: [f"model.path={lab.model('nan_weight', _nan_weight)}"],
        r"nan_weight/model.safetensors: tensor '.+' holds 1 NaN or inf value",
    ),
    refused_command(
        "sft: a NaN in the weights",
        lambda lab: ["sft", "--model", str(lab.model("sft_nan", _nan_weight)), "--out", str(lab.root / "sft_nan_out")],
        r"sft_nan/model.safetensors: tensor '.+' holds 1 NaN or inf value",
    ),
    refused(
        "model: model.path naming a LoRA adapter",
        lambda lab: [f"model.path={_adapter(lab, 'as_model', lambda d: None)}"],
        r"as_model is a LoRA adapter \(adapter_config.json\), not a model",
    ),
    refused(
        "LoRA: a target no layer has (model.lora_target_modules=[qproj])",
        lambda lab: ["model.lora_rank=8", "model.lora_target_modules=[qproj]"],
        r"model.lora_target_modules: 'qproj' matches no module of Qwen2ForCausalLM",
    ),
    refused(
        "LoRA: model.lora_rank=100000 on 128-wide layers",
        lambda lab: ["model.lora_rank=100000"],
        r"model.lora_rank=100000 exceeds the width of the smallest targeted layer.*<= 128",
    ),
    refused_command(
        "eval: a LoRA adapter whose base model was replaced in place",
        lambda lab: ["eval", _on_replaced_base(lab), *_EVAL],
        r"was trained on another base model than .*replaced_base: .* holds other weights",
    ),
    refused(
        "engine: engine.address where nothing answers (engine.connect_timeout_s=2)",
        lambda lab: [f"engine.address=127.0.0.1:{_closed_port()}", "engine.connect_timeout_s=2"],
        r"no Ray cluster answered at 127.0.0.1:\d+ within 2 s \(engine.connect_timeout_s\)",
    ),
    refused(
        "engine: engine.address where something else listens (engine.connect_timeout_s=2)",
        lambda lab: [f"engine.address=127.0.0.1:{_silent_port(lab)}", "engine.connect_timeout_s=2"],
        r"something accepts connections at 127.0.0.1:\d+, but it is not a Ray cluster \(no gRPC handshake within 2 s",
    ),
    refused(
        "engine: engine.num_cpus=1 for 2 workers",
        lambda lab: ["engine.num_cpus=1", "actor.num_workers=2", "engine.cpus_per_worker=1"],
        r"the workers need 2 CPUs \(2 actor workers x 1\), but the Ray cluster has 1",
    ),
    Case(
        "resume past the end",
        "--resume of a finished run with its own trainer.total_steps",
        "exit 0 saying so; no file of the run changes",
        _resume_past_the_end,
    ),
    Case(
        "nan sampling",
        "a NaN gradient at step 2 with the guard off (guard.enable=false, trainer.faults nan_grad)",
        "exit 2, one line naming the step and the guard",
        cli(
            lambda lab: [
                *SMALL,
                "trainer.total_steps=3",
                "guard.enable=false",
                "trainer.faults=[{kind: nan_grad, steps: [2]}]",
                f"trainer.run_dir={lab.root / 'nan_sampling'}",
            ],
            2,
            r"error: step 2: the policy's next-token distribution holds NaN or inf .*guard.enable=true",
        ),
        trains=True,
    ),
    # the run directory
    Case(
        "already holds checkpoints",
        "`armor run` into a run directory that holds checkpoints, without --resume",
        "exit 2",
        cli(lambda lab: [*SMALL, f"trainer.run_dir={lab.trained()}"], 2, r"already holds checkpoints; pass --resume"),
    ),
    Case(
        "changed config on resume",
        "--resume with actor.lr changed",
        "exit 2 naming the key",
        cli(lambda lab: [*SMALL, f"trainer.run_dir={lab.trained()}", "actor.lr=1e-3", "--resume"], 2, r"actor.lr"),
    ),
    Case("locked", "a second `armor run` into a run directory in use", "exit 2", _locked),
    # checkpoints as --resume reads them; the disk; the channel; reward scores
    *[
        Case(
            f"checkpoint {d}",
            f"newest checkpoint: {d}",
            "the older checkpoint, with a warning naming the file",
            damaged_checkpoint(d),
        )
        for d in CHECKPOINT_DAMAGE
    ],
    Case(
        "disk full",
        "disk full while a checkpoint is written (the writer raises ENOSPC)",
        "CheckpointError naming the directory; previous kept",
        disk_full,
    ),
    Case(
        "silent listener",
        "a channel peer that accepts and never answers (handshake limit set to 1 s)",
        "TimeoutError naming the address",
        silent_listener,
    ),
    Case(
        "score out of range",
        "a reward domain returning 5 (declared range [0, 1])",
        "the row fails, naming the range",
        bad_score("5"),
    ),
    Case("score nan", "a reward domain returning NaN", "the row fails", bad_score("nan")),
    Case("score text", "a reward domain returning the text '1'", "the row fails", bad_score("1", _as_text)),
    Case("sub-score nan", "a reward domain with a NaN sub-score", "the row fails", bad_score("1", _nan_part)),
    # rewards, reward models, judges and teachers (issue 42)
    Case(
        "rewards: armor reward 1e39",
        "`armor reward` on a reward.custom file returning 1e39",
        "exit 1, the row's error, a JSON line",
        _huge_reward_json,
    ),
    Case(
        "rewards: trickling service",
        "reward.remote at a server sending a byte every 0.2 s (timeout_s 1, retries 1)",
        "the rows fail within the batch's bound (2.1 s)",
        _trickling_service,
    ),
    refused(
        "rewards: reward file exits at import (armor run)",
        lambda lab: [f"reward.custom=[{{path: {_leaving_file(lab)}}}]"],
        r"leaves\.py:3: the file exits while it is read \(SystemExit\(0\)\)",
    ),
    refused_command(
        "rewards: reward file exits at import (armor reward)",
        lambda lab: [
            "reward",
            "leaves",
            "--config",
            str(_leaving_config(lab)),
            "--response",
            "x",
            "--ground-truth",
            "1",
        ],
        r"leaves\.py:3: the file exits while it is read \(SystemExit\(0\)\)",
    ),
    Case(
        "rewards: domain_map to a reward.custom domain",
        "reward.domain_map weighting a reward.custom domain beside an installed one (--dry-run)",
        "exit 0",
        _domain_map_to_file,
    ),
    refused(
        "rewards: damaged reward model",
        lambda lab: [f"reward.model={{path: {lab.model('rm_empty', _empty_weights)}}}"],
        r"^error: reward.model.path=.*rm_empty: .*has 0 bytes",
    ),
    refused(
        "rewards: damaged judge model",
        lambda lab: [f"reward.judge={{model: {lab.model('judge_empty', _empty_weights)}, template: x}}"],
        r"^error: reward.judge.model=.*judge_empty: .*has 0 bytes",
    ),
    refused(
        "rewards: damaged teacher",
        lambda lab: [f"algorithm.distill.teacher={lab.model('teacher_empty', _empty_weights)}"],
        r"^error: algorithm.distill.teacher=.*teacher_empty: .*has 0 bytes",
    ),
    refused_command(
        "rewards: rm train pairs not UTF-8",
        lambda lab: [
            "rm",
            "train",
            "--pairs",
            str(_latin1_pairs(lab)),
            "--model",
            "builtin:arithmetic-tiny",
            "--out",
            str(lab.root / "rm_latin1"),
        ],
        r"latin1_pairs\.jsonl, line 3: not UTF-8 text \(byte 0xe9",
    ),
    Case(
        "rewards: teacher with a larger vocab_size",
        "a distillation teacher with the student's tokenizer and a larger vocab_size (top-k forward KL, 2 steps)",
        "exit 0",
        _bigger_teacher_run,
        trains=True,
    ),
    # what a plugin author hit (issue 42, items 18-23)
    refused_command(
        "author: armor reward with a ground truth the domain refuses (arithmetic --ground-truth abc)",
        lambda lab: ["reward", "arithmetic", "--response", "5", "--ground-truth", "abc"],
        r"--ground-truth 'abc': reward domain 'arithmetic' cannot read this ground_truth",
    ),
    Case(
        "author: reward file bad ground truth",
        "`armor reward arithmetic --input` with a row whose ground truth the domain refuses",
        "exit 1, the row named by its line as malformed, no traceback",
        _refused_row,
    ),
    Case(
        "author: one-argument ground-truth check",
        "a plugin registering a reward domain whose validate_ground_truth takes one argument",
        "PluginError at registration naming the plugin and validate_ground_truth(ground_truth, extra)",
        _one_argument_check,
    ),
    Case(
        "author: armor new's next step",
        "`armor new reward`: the next step it prints",
        "exit 0; it installs the test extra and runs pytest",
        _next_step,
    ),
    Case(
        "author: --help-config and chat templates",
        "`armor run --help-config`: which built-in model has a chat template",
        "exit 0; model.path's help names it",
        _chat_template_help,
    ),
    Case(
        "author: --dry-run lists the environment",
        "`armor run --dry-run` with rollout.multi_turn.enable=true",
        "exit 0; the plan names the environment",
        _dry_run_environment,
    ),
    # multi-turn tools: typos refused at start, a tool that exits or hangs does not end or stall the run
    refused(
        "tools: rollout.multi_turn.parser=hermez (--dry-run)",
        lambda lab: [*_TOOLS_ON, "rollout.multi_turn.parser=hermez", "--dry-run"],
        r"unknown parser 'hermez'\. Did you mean 'hermes'\?",
    ),
    refused(
        "tools: an unknown environment_kwargs key (timout_s)",
        lambda lab: [
            *_TOOLS_ON[:1],
            "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator'], timout_s: 3}",
        ],
        r"unknown parameter 'timout_s' for ToolsEnvironment\. Did you mean 'timeout_s'\?",
    ),  # fmt: skip
    refused(
        "tools: a tool that does not import (builtin_tools:calculater)",
        lambda lab: [
            *_TOOLS_ON[:1],
            "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculater']}",
        ],
        r"has no 'calculater'\)\. Did you mean 'calculator'\?",
    ),  # fmt: skip
    Case(
        "tools: a tool that calls sys.exit(0) or never returns",
        "recipe:tools with a lookup tool that calls sys.exit(0) on some keys and never returns on others (timeout_s 1)",
        "exit 0 with summary.json; every call an error the policy reads",
        hostile_tool,
        trains=True,
    ),
    # code sandbox: a program looks for its expected output on the host (issue 42, item 4)
    Case(
        "code peek",
        "`armor reward code --ground-truth ...`: the program reads the outputs from processes' command lines",
        "score 0: the sandbox has its own /proc",
        lambda lab: _code_peek(lab),  # defined below, with its program
    ),
]

_PEEK = """import glob, re
found = 'nothing'
for p in glob.glob('/proc/[0-9]*/cmdline'):
    try:
        m = re.search(r'"outputs": \\["(\\w+)"', open(p, 'rb').read().decode('utf-8', 'replace'))
    except OSError:
        continue
    found = m.group(1) if m else found
print(found)
"""


def _code_peek(lab: Lab) -> Outcome:
    """``armor reward code`` on a program that prints the expected output it finds on the host, if any."""
    truth = json.dumps({"inputs": ["2\n"], "outputs": ["peeked" + os.urandom(4).hex()]})
    proc = lab.command("reward", "code", "--response", _PEEK, "--ground-truth", truth, "-p", "whole_response=true")
    try:
        score = json.loads(proc.stdout.splitlines()[0])["score"]
    except (IndexError, ValueError, KeyError):
        return Outcome(f"exit {proc.returncode}: {shown(message(proc.stderr))}", False)
    return Outcome(f"exit {proc.returncode}: score {score}", proc.returncode == 0 and score == 0.0)


def run_cases(cases: list[Case], lab: Lab) -> list[tuple[Case, Outcome, float]]:
    results = []
    for case in cases:
        t0 = time.perf_counter()
        try:
            outcome = case.run(lab)
        except Exception as e:  # the table reports it; the other cases still run
            outcome = Outcome(f"the case itself failed: {type(e).__name__}: {shown(str(e))}", False)
        results.append((case, outcome, time.perf_counter() - t0))
        print(
            f"{'ok  ' if outcome.ok else 'FAIL'} {case.name} ({time.perf_counter() - t0:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    return results


def table(results: list[tuple[Case, Outcome, float]]) -> str:
    lines = ["| fault tried | what happens | expected | pass |", "|---|---|---|---|"]
    for case, outcome, _ in results:
        lines.append(
            f"| {case.fault.replace('|', chr(92) + '|')} | {outcome.happened} | {case.expected} | "
            f"{'yes' if outcome.ok else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=[], help="run the cases whose name contains one of these words")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", type=Path, help="keep the scratch files in this directory")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or any(w in c.name for w in args.only)]
    if args.list:
        print("\n".join(f"{c.name}{' (a training run)' if c.trains else ''}" for c in cases))
        return 0
    root = args.keep or Path(tempfile.mkdtemp(prefix="armor_faults_"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        results = run_cases(cases, Lab(root))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(table(results))
    print(f"\n{sum(o.ok for _, o, _ in results)} of {len(results)} as expected, {time.perf_counter() - t0:.0f} s")
    return 0 if all(o.ok for _, o, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
