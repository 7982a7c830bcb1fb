"""A training run whose reward domain fails on most rows stops with a one-line error, instead of
training on reward.failure_score alone and ending as if all went well."""

from __future__ import annotations

import json

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.trainer import run_training
from armor_core.rewards.checks import RewardFailureError

pytestmark = pytest.mark.slow


def test_a_domain_failing_on_every_row_stops_the_run_at_its_first_step(ray_cluster, tmp_path):
    data = tmp_path / "words.jsonl"  # gsm8k compares numbers: a ground truth in words fails every row
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+1=", "data_source": "gsm8k", "ground_truth": "forty"}) + "\n" for i in range(16)
        )
    )
    cfg = load_config(
        None,
        [
            f"data.train_files=[{data}]",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.max_new_tokens=4",
            "trainer.total_steps=3",
            "trainer.loggers=[jsonl]",
            "engine.cpus_per_worker=1",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(RewardFailureError) as e:
        run_training(cfg)
    assert str(e.value).startswith(
        "reward domain 'gsm8k' failed on 16 of its 16 rows in the last 1 scored batch, more than "
        "reward.max_failure_fraction=0.5; e.g. ValueError: gsm8k ground truth 'forty' is not a number"
    )
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or "actor/pg_loss" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    )


def _two_steps(tmp_path, *overrides):
    """Two steps of the built-in task with ``overrides``; the rows of the training steps in metrics.jsonl."""
    small = ["data.train_size=64", "data.val_size=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
             "rollout.n=4", "rollout.max_new_tokens=4", "trainer.total_steps=2", "trainer.loggers=[jsonl]",
             "engine.cpus_per_worker=1", f"trainer.run_dir={tmp_path / 'run'}"]  # fmt: skip
    run_training(load_config(None, [*overrides, *small]))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "actor/pg_loss" in r]


def test_a_run_scores_its_rows_with_a_verl_reward_file(ray_cluster, tmp_path):
    reward_file = tmp_path / "exact_file.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    hit = solution_str.strip() == str(ground_truth).strip()\n"
        "    return {'score': float(hit), 'acc': hit, 'is_arithmetic': float(data_source == 'arithmetic')}\n"
    )
    steps = _two_steps(tmp_path, f"reward.custom=[{{path: {reward_file}, data_sources: [arithmetic]}}]")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # the file scored the built-in task's rows, in place of the arithmetic domain
        assert r["reward/exact_file/is_arithmetic"] == 1.0 and r["reward/exact_file/failures"] == 0.0
        assert 0.0 <= r["reward/exact_file/acc"] == r["reward/exact_file/score"] <= 1.0
        assert "reward/arithmetic/score" not in r


def test_a_run_scores_its_rows_with_a_reward_service(ray_cluster, tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Exact(BaseHTTPRequestHandler):  # a reward service in OpenRLHF's shapes: exact answers score 1
        def do_POST(self):  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(len(body["query"]))
            rewards = [float(r.strip() == str(g)) for r, g in zip(body["responses"], body["labels"])]
            payload = json.dumps({"rewards": rewards}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exact)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/get_reward"
    try:
        steps = _two_steps(tmp_path, f"reward.remote={{url: '{url}', data_sources: [arithmetic], batch_size: 8}}")
    finally:
        server.shutdown()
        server.server_close()
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["reward/remote/score"] <= 1.0 and r["reward/remote/failures"] == 0.0
    assert seen.count(8) >= 4  # each step's 16 rows went in chunks of 8 (and validation's 8 rows in one)
