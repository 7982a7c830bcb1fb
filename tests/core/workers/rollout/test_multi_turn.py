"""Multi-turn rollouts over the ``hf`` backend with a tiny Qwen2 and a Qwen-style chat template built
here: the ids trained on are the ids sampled across turns, observation tokens are masked out of the
loss (their gradient is exactly 0), an episode that ends after one turn is the single-turn rollout,
environments step concurrently, and every way an environment can fail ends its episode, counted,
without failing the batch."""

import asyncio
import sys
import time

import numpy as np
import pytest
import torch

from armor_core.config.schema import MultiTurnConfig, RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import EnvironmentStep
from armor_core.models.loading import build_char_tokenizer, build_tiny_model
from armor_core.workers.forward.layouts import forward_response_logits, response_log_probs
from armor_core.workers.rollout.multi_turn import MultiTurnRollout
from armor_core.workers.rollout.observations import TRUNCATED, ObservationRenderer
from armor_plugins.rollout.hf import HFRollout

QWEN_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789 :\n<>|_/[]().,'")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = QWEN_STYLE
    return tok


@pytest.fixture(scope="module")
def model(tokenizer):
    m = build_tiny_model("qwen2", len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m.eval()


def _prompts(tokenizer, texts):
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True) for t in texts]  # fmt: skip
    enc = tokenizer(rendered, add_special_tokens=False, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        non_tensors={"extra": [{"k": i} for i in range(len(texts))], "raw_prompt": list(texts)},
    )


class Scripted:
    """Answers each turn with "obs<turn>" and ends after ``turns`` turns."""

    def __init__(self, row, *, seed=0, turns=3):
        self.turns, self.seen = turns, []

    def reset(self):
        return None

    def step(self, turn):
        self.seen.append(turn)
        done = turn.index + 1 >= self.turns
        return EnvironmentStep(observation=None if done else f"obs{turn.index}", done=done, reward_parts={"r": 1.0})


class Spy:
    """The inner backend, recording every turn it sampled."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.eos_token_ids, self.pad_token_id = inner.eos_token_ids, inner.pad_token_id

    def generate(self, prompts, **kw):
        out = self.inner.generate(prompts, **kw)
        self.calls.append(out)
        return out


def _rollout(model, tokenizer, env_cls, spy=False, **mt):
    config = RolloutConfig(max_new_tokens=6, temperature=1.0, multi_turn=MultiTurnConfig(enable=True, **mt))
    inner = HFRollout(model, tokenizer, config)
    inner = Spy(inner) if spy else inner
    return MultiTurnRollout(inner, tokenizer, config, env_cls), inner


def test_ids_trained_on_are_the_ids_sampled_over_three_turns(model, tokenizer):
    torch.manual_seed(0)
    rollout, spy = _rollout(model, tokenizer, Scripted, spy=True, max_turns=5, max_response_tokens=200)
    out = rollout.generate(_prompts(tokenizer, ["ab", "abc"]), n=2)
    assert len(spy.calls) == 3 and out.meta_info["metrics"]["env/ended_done"] == 1.0
    resp, rmask = out["responses"], out["response_mask"]
    renderer = ObservationRenderer(tokenizer, max_tokens=64)
    for row in range(4):
        sampled = [call["responses"][row][call["response_mask"][row].bool()].tolist() for call in spy.calls]
        ids = resp[row].tolist()
        expected, mask = [], []
        for k, turn in enumerate(sampled):  # sampled ids, then the observation's ids, turn after turn
            expected += turn
            mask += [1] * len(turn)
            if k < 2:
                ended = tokenizer.decode(turn[-1:]) if turn and turn[-1] == tokenizer.eos_token_id else None
                obs = renderer.render(f"obs{k}", ended)[0]
                expected += obs
                mask += [0] * len(obs)
        assert ids[: len(expected)] == expected and all(t == tokenizer.pad_token_id for t in ids[len(expected) :])
        assert rmask[row].tolist() == mask + [0] * (len(ids) - len(mask))  # only sampled ids are in the loss
        assert out["attention_mask"][row, -resp.shape[1] :].tolist() == [1] * len(mask) + [0] * (len(ids) - len(mask))
        assert (out["rollout_log_probs"][row][torch.tensor(mask + [0] * (len(ids) - len(mask))) == 0] == 0).all()
    # the trainer's log-probs of the assembled sequence are the sampler's, at every sampled position
    with torch.no_grad():
        logits = forward_response_logits(
            model, out["input_ids"], out["attention_mask"], out["position_ids"], resp.shape[1]
        )
        lp, _ = response_log_probs(logits, resp, 1.0, False)
    gap = ((lp - out["rollout_log_probs"]).abs() * rmask).max().item()
    assert gap < 1e-4


def test_nucleus_sampled_turns_carry_their_kept_sets_and_the_trainer_replays_them(model, tokenizer):
    """Sampling-mask replay across turns: every sampled id keeps the set it was drawn from, observation ids none,
    and the trainer's log-probs over those sets are the rollout's at every sampled position."""
    from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS, replayed

    torch.manual_seed(2)
    config = RolloutConfig(max_new_tokens=6, top_p=0.7, multi_turn=MultiTurnConfig(enable=True, max_turns=3))
    rollout = MultiTurnRollout(HFRollout(model, tokenizer, config), tokenizer, config, Scripted)
    out = rollout.generate(_prompts(tokenizer, ["ab", "abc"]), n=2)
    rmask, kept, resp = out["response_mask"].bool(), out[KEPT_IDS], out["responses"]
    present = out["attention_mask"][:, -resp.shape[1] :].bool()
    assert (present & ~rmask).any(), "the episodes hold observation ids"
    assert ((kept >= 0).any(-1) == rmask).all(), "a set at every sampled id, none at an observation's or padding"
    assert ((kept == resp[..., None]).any(-1) | ~rmask).all()
    assert (out[KEPT_MASS][~rmask] == 1).all() and float(out[KEPT_MASS][rmask].mean()) < 0.95
    with torch.no_grad():
        logits = forward_response_logits(
            model, out["input_ids"], out["attention_mask"], out["position_ids"], resp.shape[1]
        )
        lp, _ = response_log_probs(logits, torch.cat([resp[..., None], kept.long().clamp(min=0)], -1), 1.0, False)
    gap = (replayed(lp[..., 0], lp[..., 1:], kept) - out["rollout_log_probs"])[rmask]
    assert gap.abs().max() < 1e-4


def test_seeded_episodes_give_the_same_turns_alone_as_in_a_batch(model, tokenizer):
    """Per-sample seeds over turns: an episode's turns (and its environment's seed) come from its own seed, whatever
    the episodes beside it; its n copies differ."""
    from armor_core.ops.sample_seeds import SEED_KEY, row_seeds

    prompts = _prompts(tokenizer, ["ab", "abc", "b"])
    prompts["uid"] = np.arange(3)
    prompts = prompts.repeat(2, interleave=True)
    prompts[SEED_KEY] = row_seeds(7, 0, np.arange(3), 2)
    rollout, _ = _rollout(model, tokenizer, Scripted, max_turns=3, max_response_tokens=200)
    torch.manual_seed(0)
    together = rollout.generate(prompts)
    torch.manual_seed(1)  # another global generator state: seeded episodes do not draw from it
    alone = rollout.generate(prompts[np.array([4, 5])])
    assert torch.equal(alone["responses"], together["responses"][4:, : alone["responses"].shape[1]])
    assert (together["responses"][4:, alone["responses"].shape[1] :] == tokenizer.pad_token_id).all()
    assert not torch.equal(together["responses"][0], together["responses"][1])


def test_observation_positions_get_exactly_zero_gradient(model, tokenizer):
    from armor_core.plugins import get_plugin

    torch.manual_seed(1)
    rollout, _ = _rollout(model, tokenizer, Scripted, max_turns=3, max_response_tokens=200)
    out = rollout.generate(_prompts(tokenizer, ["ab"]), n=2)
    rmask = out["response_mask"].float()
    log_prob = out["rollout_log_probs"].clone().requires_grad_(True)
    loss_fn = get_plugin("policy_loss", "ppo_clip").fn
    loss_mat, _ = loss_fn(log_prob, out["rollout_log_probs"], torch.ones_like(rmask), rmask)
    agg = get_plugin("loss_aggregation", "token-mean").fn
    agg(loss_mat, rmask, global_num_tokens=rmask.sum(), global_num_seqs=2, norm_constant=1.0).backward()
    observation = (out["attention_mask"][:, -rmask.shape[1] :] == 1) & (rmask == 0)
    assert observation.any() and (log_prob.grad[observation] == 0).all()
    assert (log_prob.grad[rmask.bool()] != 0).all()


def test_an_episode_that_ends_after_one_turn_is_the_single_turn_rollout(model, tokenizer):
    prompts = _prompts(tokenizer, ["ab", "abc"])
    torch.manual_seed(3)
    rollout, inner = _rollout(model, tokenizer, lambda row, seed=0: Scripted(row, turns=1), max_response_tokens=6)
    multi = rollout.generate(prompts, n=2)
    torch.manual_seed(3)
    torch.randint(0, 2**31 - 1, (2,))  # the runner draws one environment seed per prompt before sampling
    single = inner.generate(prompts, n=2)
    width = single["responses"].shape[1]
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(multi[key][:, :width], single[key]), key
    assert torch.equal(multi["attention_mask"], single["attention_mask"])


def test_environments_step_concurrently(model, tokenizer):
    class Slow(Scripted):
        def step(self, turn):
            time.sleep(1.0)
            return EnvironmentStep(done=True)

    class SlowAsync(Scripted):
        async def step(self, turn):
            await asyncio.sleep(1.0)
            return EnvironmentStep(done=True)

    for env in (Slow, SlowAsync):
        rollout, _ = _rollout(model, tokenizer, env, max_response_tokens=6)
        start = time.perf_counter()
        rollout.generate(_prompts(tokenizer, ["a"] * 8), n=1)
        assert time.perf_counter() - start < 3.0, env.__name__  # 8 episodes waiting 1 s each: about 1 s, not 8


@pytest.mark.parametrize(
    "behaviour, reason",
    [
        ("raise", "env_error"),
        ("not_a_step", "env_error"),
        ("not_text", "env_error"),
        ("hang", "env_timeout"),
        ("never_done", "max_turns"),
        ("exit", "env_error"),
        ("exit_zero", "env_error"),
        ("exit_async", "env_error"),
        ("hang_async", "env_timeout"),
        ("reward_part_text", "env_error"),
        ("reward_part_none", "env_error"),
        ("reward_part_nan", "env_error"),
        ("reward_part_inf", "env_error"),
        ("reward_parts_list", "env_error"),
        ("metric_list", "env_error"),
        ("metric_text", "env_error"),
    ],
)
def test_a_failing_environment_ends_its_episode_not_the_batch(model, tokenizer, behaviour, reason):
    bad_steps = {
        "reward_part_text": EnvironmentStep(done=True, reward_parts={"r": "high"}),
        "reward_part_none": EnvironmentStep(done=True, reward_parts={"r": None}),
        "reward_part_nan": EnvironmentStep(done=True, reward_parts={"r": float("nan")}),
        "reward_part_inf": EnvironmentStep(done=True, reward_parts={"r": float("inf")}),
        "reward_parts_list": EnvironmentStep(done=True, reward_parts=[1.0]),
        "metric_list": EnvironmentStep(done=True, metrics={"m": [1, 2]}),
        "metric_text": EnvironmentStep(done=True, metrics={"m": "1"}),
    }

    class Bad(Scripted):
        def step(self, turn):
            if self.row_index and behaviour != "never_done":  # only the second row's environment misbehaves
                if behaviour == "raise":
                    raise RuntimeError("tool crashed")
                if behaviour == "exit":
                    sys.exit(2)  # argparse on bad arguments
                if behaviour == "exit_zero":
                    raise SystemExit(0)
                if behaviour in bad_steps:
                    return bad_steps[behaviour]
                if behaviour == "not_a_step":
                    return {"observation": "x"}
                if behaviour == "not_text":
                    return EnvironmentStep(observation=12345)
                time.sleep(5)
            if behaviour == "never_done":
                return EnvironmentStep(observation="again")
            return EnvironmentStep(done=True)

        def __init__(self, row, seed=0):
            super().__init__(row)
            self.row_index = row["extra"]["k"]

    class BadAsync(Bad):
        async def step(self, turn):
            if self.row_index:
                if behaviour == "exit_async":
                    sys.exit(2)  # asyncio lets SystemExit out of its loop
                await asyncio.sleep(5)
            return EnvironmentStep(done=True, reward_parts={"r": 1.0})

    env_cls = BadAsync if behaviour.endswith("_async") else Bad
    rollout, _ = _rollout(model, tokenizer, env_cls, max_turns=2, max_response_tokens=100, step_timeout_s=0.5)
    start = time.perf_counter()
    out = rollout.generate(_prompts(tokenizer, ["a", "b"]), n=1)
    assert time.perf_counter() - start < 4.0  # a hung environment does not hold the batch (it sleeps 5 s)
    metrics = out.meta_info["metrics"]
    share = 1.0 if behaviour == "never_done" else 0.5
    assert metrics[f"env/ended_{reason}"] == share
    assert len(out) == 2
    # a step that failed adds none of its parts: the row's reward components stay finite numbers
    assert all(isinstance(v, float) and np.isfinite(v) for p in out.non_tensors["env_reward_parts"] for v in p.values())


def test_long_observations_are_cut_with_a_visible_marker(tokenizer):
    renderer = ObservationRenderer(tokenizer, max_tokens=40)
    ids, cut = renderer.render([{"role": "tool", "content": "x" * 500}], "<|im_end|>")
    text = tokenizer.decode(ids)
    assert cut and len(ids) <= 40 and TRUNCATED.strip() in text and text.startswith("\n<|im_start|>tool\nx")
    short, cut = renderer.render("hi", None)  # a turn cut by the budget gets the end of its turn first
    assert not cut and tokenizer.decode(short).startswith("<|im_end|>\n<|im_start|>user\nhi")


def test_the_episodes_of_one_group_share_an_environment_seed(model, tokenizer):
    seen = []

    class Seeds(Scripted):
        def __init__(self, row, seed=0):
            super().__init__(row, turns=1)
            seen.append((int(row["uid"]), seed))

    rollout, _ = _rollout(model, tokenizer, Seeds, max_response_tokens=6)
    prompts = _prompts(tokenizer, ["a", "a", "b", "b"])  # as the trainer sends them: repeated, with their group
    prompts.non_tensors["uid"] = np.array([0, 0, 1, 1])
    rollout.generate(prompts)
    assert seen[0][1] == seen[1][1] and seen[2][1] == seen[3][1] and seen[0][1] != seen[2][1]


def test_each_episode_lists_its_turns_and_which_tokens_were_the_policys(model, tokenizer):
    class ToolAnswers(Scripted):
        def step(self, turn):
            done = turn.index + 1 >= self.turns
            return EnvironmentStep(observation=None if done else [{"role": "tool", "content": "42"}], done=done)

    torch.manual_seed(4)
    rollout, _ = _rollout(model, tokenizer, ToolAnswers, max_turns=3, max_response_tokens=200)
    out = rollout.generate(_prompts(tokenizer, ["ab", "abc"]))
    width = out["responses"].shape[1]
    for row, episode in enumerate(out.non_tensors["episode"]):
        turns, mask = episode["turns"], out["response_mask"][row]
        assert episode["end"] == "done"
        assert [t["role"] for t in turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
        # the turns tile the episode's ids, and a turn is the policy's exactly where the response mask is 1
        assert [t["start"] for t in turns] == [0] + [t["end"] for t in turns[:-1]]
        assert turns[-1]["end"] == int(out["attention_mask"][row, -width:].sum())
        for t in turns:
            assert t["end"] > t["start"] and (mask[t["start"] : t["end"]] == (t["role"] == "assistant")).all()
