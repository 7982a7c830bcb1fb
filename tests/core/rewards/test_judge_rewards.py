"""A generative judge (``reward.judge``): an OpenAI-compatible endpoint on the loopback address and a tiny
local model; the template fills from the row, the verdict is read as a label or a score, and a verdict
that says neither fails its row with the verdict in the error."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.judge import Verdicts
from armor_core.rewards.manager import RewardManager

TEMPLATE = "Question: {prompt}\nAnswer: {response}\nReference: {ground_truth}\nCorrect? yes or no:"


class Chat(BaseHTTPRequestHandler):
    """An OpenAI-compatible judge: 'Yes.' when the answer equals the reference, a hedge for 'maybe'."""

    seen: list = []

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        ask = body["messages"][0]["content"]
        answer = ask.split("Answer: ")[1].split("\n")[0]
        reference = ask.split("Reference: ")[1].split("\n")[0]
        verdict = "I cannot tell." if answer == "maybe" else "Yes." if answer == reference else "No, it is wrong."
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    Chat.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_an_endpoint_judge_reads_labels_and_fails_a_row_it_cannot_read(endpoint, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    entry = {"url": endpoint, "model_name": "judge-7b", "api_key_env": "JUDGE_KEY", "template": TEMPLATE,
             "data_sources": ["qa"]}  # fmt: skip
    with RewardManager(RewardConfig(judge=entry, failure_score=-1.0), PluginManager()) as manager:
        batch = manager.score(["2+2="] * 3, ["4", "5", "maybe"], ["qa"] * 3, ["4", "4", "4"])
    assert batch.scores.tolist() == [1.0, 0.0, -1.0]
    assert "names none of ['no', 'yes']: 'I cannot tell.'" in batch.errors[2]
    path, auth, body = Chat.seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["model"] == "judge-7b" and body["temperature"] == 0.0 and body["max_tokens"] == 32
    assert body["messages"][0]["content"].startswith("Question: 2+2=\nAnswer: ")


def test_a_local_judge_generates_its_verdict_greedily_in_a_reward_worker():
    import torch

    from armor_core.models.loading import load_model, load_tokenizer

    prompts = ["12+30=", "7+8=", "40+41="]
    entry = {"model": "builtin:arithmetic-tiny", "template": "{prompt}", "parser": "score",
             "score_range": [0, 10000], "max_new_tokens": 4, "data_sources": ["arith"]}  # fmt: skip
    with RewardManager(RewardConfig(judge=entry), PluginManager()) as manager:
        batch = manager.score(prompts, ["", "", ""], ["arith"] * 3, [None] * 3)
    model, tokenizer = load_model("builtin:arithmetic-tiny").eval(), load_tokenizer("builtin:arithmetic-tiny")
    expected = []
    for prompt in prompts:  # the judge's verdict is what the model says greedily; its first number is the score
        enc = tokenizer([prompt], return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        expected.append(float(text.strip().split()[0]) if text.strip() else None)
    assert batch.scores.tolist() == expected


def test_verdicts_take_the_earliest_whole_word_label_and_a_score_in_range():
    labels = Verdicts("{response}", "label", {"yes": 1.0, "no": 0.0}, [0, 10], False, "")
    assert labels.read("I know it: No. (yes would be wrong)").score == 0.0  # 'know' is not 'no'
    assert labels.read("YES").score == 1.0
    scores = Verdicts("{response}", "score", {}, [0, 10], True, "")
    assert scores.read("Score: 7/10").score == 0.7
    with pytest.raises(ValueError, match=r"score 11 lies outside \[0, 10\]"):
        scores.read("11")
    assert Verdicts("{rubric}|{response}", "label", {"y": 1}, [0, 1], False, "be kind").ask("p", "r", None, {}) == (
        "be kind|r"
    )
    assert (
        Verdicts("{rubric}", "label", {"y": 1}, [0, 1], False, "x").ask("p", "r", None, {"rubric": "row's"}) == "row's"
    )


def test_judge_settings_are_checked_at_start(endpoint):
    for entry, message in [
        ({"url": endpoint, "model": "builtin:arithmetic-tiny", "template": "x"}, r"exactly one of 'model'"),
        ({"url": endpoint, "template": "{question}"}, r"unknown field\(s\) question; it may use ground_truth"),
        ({"url": endpoint, "template": "{prompt"}, r"template: .*a literal brace"),
        ({"url": endpoint, "template": "x", "parser": "regex"}, r"parser='regex': expected label or score"),
        ({"url": endpoint, "template": "x", "labels": {"yes": "good"}}, r"labels=.*expected \{label: score\}"),
        ({"url": "judge:8000", "template": "x"}, r"url='judge:8000': expected an http"),
        ({"model": "nowhere", "template": "x"}, r"reward.judge.model: .*nowhere"),
        ({"url": endpoint, "template": "x", "placement": "worker"}, r"placement='worker': .*an endpoint is its own"),
        ({"model": "builtin:arithmetic-tiny", "template": "x", "placement": "gpu"}, r"expected pool or worker"),
    ]:
        with pytest.raises(ConfigError, match=message):
            RewardManager(RewardConfig(judge=entry), PluginManager())


def test_domain_map_routes_rows_to_a_judge_endpoint_or_a_local_judge(endpoint, tmp_path):
    from armor_core.config.plugin_checks import validate_plugins
    from armor_core.config.schema import load_config

    run = tmp_path / "run.yaml"  # JSON is YAML, and keeps the template's newlines
    run.write_text(json.dumps({"reward": {"judge": {"url": endpoint, "template": TEMPLATE, "domain": "grader"}}}))
    cfg = load_config(str(run), ["reward.domain_map.qa={grader: 0.5, format: 0.0}"])
    validate_plugins(cfg, PluginManager())  # what armor run checks first: 'grader' is the config's own domain
    with RewardManager(cfg.reward, PluginManager()) as manager:
        batch = manager.score(["2+2="] * 2, ["4", "5"], ["qa"] * 2, ["4", "4"])
    assert batch.scores.tolist() == [0.5, 0.0]
    local = "reward.judge={model: 'builtin:arithmetic-tiny', template: '{prompt}', domain: local_judge}"
    cfg = load_config(None, [local, "reward.domain_map.arith=local_judge"])
    validate_plugins(cfg, PluginManager())
    with RewardManager(cfg.reward, PluginManager()) as manager:
        assert manager.domains_for("arith") == {"local_judge": 1.0}
