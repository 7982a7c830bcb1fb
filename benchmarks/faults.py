"""Reliability: the faults a hostile but fair user can cause, each tried on the real thing, and what
ARMOR does, printed as a markdown table (the README's "Reliability" table is this script's output).

    python benchmarks/faults.py                  # every case: 3 short training runs and ~30 quick ones
    python benchmarks/faults.py --only model     # the cases whose name contains "model"
    python benchmarks/faults.py --list

A case runs ``armor run ...`` as a user would (a subprocess: the table shows its exit code and the
first line of its error or warning), or, for a fault the command line cannot make (a full disk, a
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

from armor_core.testing.damage import CHECKPOINT_DAMAGE

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
        return subprocess.run(
            [sys.executable, "-m", "armor_core.cli.main", "run", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
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


def cli(args: Callable[[Lab], list[str]], code: int, pattern: str) -> Callable[[Lab], Outcome]:
    """A case that runs ``armor run <args>`` and expects exit ``code`` and a message matching ``pattern``."""

    def run(lab: Lab) -> Outcome:
        proc = lab.armor(*args(lab))
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


def bad_score(response: str) -> Callable[[Lab], Outcome]:
    def run(lab: Lab) -> Outcome:
        from armor_core import RewardDomain, hookimpl
        from armor_core.config.schema import RewardConfig
        from armor_core.plugins import PluginManager
        from armor_core.rewards.manager import RewardManager

        class Plugin:
            @hookimpl
            def armor_register_reward_domains(self, register):
                register("loud", RewardDomain(_loud, requires_ground_truth=False, inline=True))

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


def _locked(lab: Lab) -> Outcome:
    from armor_core.storage.run_dir import RunDirLock

    with RunDirLock(lab.trained()):  # as a second `armor run` into the directory would meet the first
        return cli(
            lambda lab: [*SMALL, f"trainer.run_dir={lab.run_dir}", "--resume"], 2, r"is in use by another armor run"
        )(lab)


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
]


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
