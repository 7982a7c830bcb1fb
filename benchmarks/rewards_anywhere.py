"""Rewards from anywhere, end to end on this machine: a reward model trained on a hidden rule, RL
against it alone, and the seconds each way in adds to a step.

    python benchmarks/rewards_anywhere.py                    # about 7 minutes on 2 cores
    python benchmarks/rewards_anywhere.py --rl-steps 100 --timing-steps 20

The hidden rule: an answer whose last digit is even. Preference pairs are built from the built-in
arithmetic task's prompts (train split for training, test split held out), chosen an even number,
rejected an odd one; the policy never sees the rule. Then:

1. ``armor rm train`` on the pairs: held-out ranking accuracy (target >= 0.9).
2. ``armor run`` on the default job with ``reward.model`` as the only reward, normalised, the rule
   beside it at weight 0 (``rule: even``): the rule's score on the step's samples (first and last 10
   steps), ``reward/model_minus_rule``, and greedy accuracy under the rule with ``armor eval`` on the
   built-in model and on the final checkpoint (target: +20 points).
3. ``--timing-steps`` steps of ``armor run`` with each way in scoring the task's exactness: the
   built-in ``arithmetic`` domain, a verl-style file (``reward.custom``), the same batched, a reward
   service on the loopback address (``reward.remote``, served by this script), the reward model (in
   the reward pool, and on a worker of its own: then the actor has one core of the two), and
   a generative judge (the built-in tiny model given the prompt; the number it answers is the score:
   what a judge costs, not what it is worth): the median ``timing_s/reward`` per step after 3
   warm-up steps (``--only TEXT``: the ways whose name holds TEXT).

Runs one thing at a time; time nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EVEN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    s = solution_str.strip()
    return float(s.isdigit() and int(s[-1]) % 2 == 0)
"""
EXACT = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth).strip())
"""
EXACT_BATCHED = """
def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s.strip() == str(g).strip()) for s, g in zip(solution_strs, ground_truths)]
"""


class Exact(BaseHTTPRequestHandler):
    """A reward service in OpenRLHF's shapes: 1 for an exact answer."""

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = [float(r.strip() == str(g).strip()) for r, g in zip(body["responses"], body["labels"])]
        payload = json.dumps({"rewards": rewards}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def _armor(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "armor_core.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stdout[-3000:] + done.stderr[-3000:]
        raise SystemExit(f"armor {' '.join(args)} failed ({done.returncode}):\n{tail}")
    return done.stdout


def _pairs(path: Path, split: str, size: int, seed: int) -> Path:
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    rng = random.Random(seed)
    with open(path, "w") as f:
        for row in generate_arithmetic(split, size, seed):
            chosen, rejected = str(rng.randrange(0, 100) * 2), str(rng.randrange(0, 100) * 2 + 1)
            f.write(json.dumps({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected}) + "\n")
    return path


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "actor/pg_loss" in r]


def _rule_accuracy(model: str, even: Path) -> float:
    out = _armor("eval", model, "--data", "task:arithmetic", "--json",
                 f"reward.custom=[{{path: {even}, data_sources: [arithmetic], requires_ground_truth: false}}]")  # fmt: skip
    return float(json.loads(out[out.index("{") :])["arithmetic/acc_greedy"])


def _rl_against_the_model(args: argparse.Namespace, tmp: Path, rm: Path, even: Path, record: dict) -> None:
    run = tmp / "rl"
    _armor("run", f"trainer.run_dir={run}", f"trainer.total_steps={args.rl_steps}",
           f"reward.custom=[{{path: {even}, domain: even, requires_ground_truth: false}}]",
           f"reward.model={{path: {rm}, data_sources: [arithmetic], rule: even, normalize: true}}")  # fmt: skip
    steps = _steps(run)
    checkpoint = sorted((run / "checkpoints").glob("step_*"))[-1] / "model"
    before, after = _rule_accuracy("builtin:arithmetic-tiny", even), _rule_accuracy(str(checkpoint), even)
    first, last = steps[:10], steps[-10:]

    def mean(rows: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    print("\n## reward model on a hidden rule (an answer's last digit is even)\n")
    print("| measure | value |\n|---|---:|")
    print(f"| preference pairs, train / held out | {args.pairs} / {args.pairs // 4} |")
    print(f"| held-out ranking accuracy, before / after `armor rm train` ({record['seconds']:.1f} s) | "
          f"{record['val_accuracy_before']:.3f} / {record['val_accuracy']:.3f} |")  # fmt: skip
    print(f"| RL steps against the reward model alone | {len(steps)} |")
    print(f"| rule score of the step's samples, first / last 10 steps | {mean(first, 'reward/even/score'):.3f} / "
          f"{mean(last, 'reward/even/score'):.3f} |")  # fmt: skip
    print(f"| greedy accuracy under the rule (`armor eval`, 500 test prompts), before / after | {before:.3f} / "
          f"{after:.3f} ({100 * (after - before):+.1f} pts) |")  # fmt: skip
    print(f"| reward/model_minus_rule, first / last 10 steps | {mean(first, 'reward/model_minus_rule'):+.3f} / "
          f"{mean(last, 'reward/model_minus_rule'):+.3f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2000, help="training preference pairs (held out: a quarter)")
    ap.add_argument("--rl-steps", type=int, default=250, help="RL steps against the reward model (default job: 250)")
    ap.add_argument("--timing-steps", type=int, default=30, help="steps of each way-in timing run")
    ap.add_argument("--timing-only", action="store_true", help="skip the RL run against the reward model")
    ap.add_argument("--only", default="", help="time only the ways in whose name contains this text")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="armor-rewards-anywhere-"))
    even, exact, batched = tmp / "even.py", tmp / "exact.py", tmp / "exact_batched.py"
    for path, text in ((even, EVEN), (exact, EXACT), (batched, EXACT_BATCHED)):
        path.write_text(text)

    train = _pairs(tmp / "pairs.jsonl", "train", args.pairs, 0)
    held = _pairs(tmp / "held.jsonl", "test", args.pairs // 4, 1)
    rm = tmp / "rm"
    _armor("rm", "train", "--pairs", str(train), "--val-pairs", str(held), "--model", "builtin:arithmetic-tiny",
           "--out", str(rm), "--steps", "100", "--lr", "3e-4", "--eval-every", "50")  # fmt: skip
    record = json.loads((rm / "armor_rm.json").read_text())

    if not args.timing_only:
        _rl_against_the_model(args, tmp, rm, even, record)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exact)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/get_reward"
    ways = {
        "built-in domain (`arithmetic`, inline)": [],
        "file, one row a call (`reward.custom`)": [f"reward.custom=[{{path: {exact}, data_sources: [arithmetic]}}]"],
        "file, batched (`reward.custom`, `batched: true`)": [
            f"reward.custom=[{{path: {batched}, data_sources: [arithmetic], batched: true}}]"
        ],
        "HTTP service on the loopback (`reward.remote`)": [
            f"reward.remote={{url: '{url}', data_sources: [arithmetic]}}"
        ],
        "reward model (`reward.model`, 1 thread)": [f"reward.model={{path: {rm}, data_sources: [arithmetic]}}"],
        "reward model on a worker of its own (`reward.model`, `placement: worker`)": [
            f"reward.model={{path: {rm}, data_sources: [arithmetic], placement: worker}}"
        ],
        "generative judge, local tiny model (`reward.judge`, 4 new tokens)": [
            "reward.judge={model: 'builtin:arithmetic-tiny', template: '{prompt}', parser: score, "
            "score_range: [0, 100000], scale: true, max_new_tokens: 4, data_sources: [arithmetic]}"
        ],
    }
    print(f"\n## seconds of reward per step ({args.timing_steps} steps of the default job, 128 rows a step, "
          "median after 3 warm-up steps)\n")  # fmt: skip
    print("| way in | reward s/step | step s | mean reward, last step |\n|---|---:|---:|---:|")
    try:
        for i, (name, overrides) in enumerate(ways.items()):
            if args.only not in name:
                continue
            out = tmp / f"timing{i}"
            _armor("run", f"trainer.run_dir={out}", f"trainer.total_steps={args.timing_steps}",
                   "trainer.val_before_train=false", f"trainer.val_freq={args.timing_steps}", *overrides)  # fmt: skip
            rows = _steps(out)[3:]
            reward = statistics.median(r["timing_s/reward"] for r in rows)
            step = statistics.median(r["timing_s/step"] for r in rows)
            print(f"| {name} | {reward:.4f} | {step:.3f} | {rows[-1]['critic/score/mean']:.3f} |", flush=True)
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
