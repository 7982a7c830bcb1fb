"""The ``hf`` rollout backend: output layout, EOS masking, determinism, log-probs, weight sync."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

import armor_plugins.rollout.hf as hf_module
from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import RolloutBackend
from armor_core.models.loading import (
    build_char_tokenizer,
    build_tiny_model,
    encode_prompts,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from armor_core.testing import left_padded_batch, registered
from armor_plugins.rollout.hf import HFRollout, sample_next_token

PROMPTS = ["1+2=", "12+34=", "99+9=", "5="]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


class ScriptedCache:
    """CountingLM's KV cache: it holds nothing, but records which batch rows were selected from it."""

    def __init__(self) -> None:
        self.selections: list[list[int]] = []

    def reorder_cache(self, rows: torch.Tensor) -> None:
        self.selections.append(rows.tolist())


class CountingLM(torch.nn.Module):
    """A scripted causal LM: the next token is always (last input token + 1) mod vocab.

    It has no real cache (it only looks at the last input token) and records every call, which
    makes the expected greedy responses computable by hand. With ``selectable_cache=False`` its
    cache is a plain counter that cannot select rows, like a model outside transformers might have.
    """

    def __init__(self, vocab: int = 10, eos: int = 1, selectable_cache: bool = True) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.vocab = vocab
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.selectable_cache = selectable_cache
        self.calls: list[dict] = []
        self.caches: list = []

    def forward(self, input_ids, attention_mask, position_ids, past_key_values=None, use_cache=True):
        self.calls.append(
            {
                "shape": tuple(input_ids.shape),
                "training": self.training,
                "position_ids": position_ids.clone(),
                "attention_mask": attention_mask.clone(),
                "input_ids": input_ids.clone(),
            }
        )
        nxt = (input_ids + 1) % self.vocab
        logits = 10.0 * torch.nn.functional.one_hot(nxt, self.vocab).float() + self.dummy
        if past_key_values is None:
            past_key_values = ScriptedCache() if self.selectable_cache else 0
            self.caches.append(past_key_values)
        elif not self.selectable_cache:
            past_key_values += 1
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)


@pytest.fixture(scope="module")
def prompts(tok):
    ids, mask, pos, _ = encode_prompts(tok, PROMPTS, max_length=32)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def _cfg(**kw) -> RolloutConfig:
    return RolloutConfig(**{"max_new_tokens": 6, **kw})


# -- layout and EOS ---------------------------------------------------------------------------------


def test_registered_and_follows_the_protocol(model, tok):
    with registered(hf_module, load_entrypoints=False) as pm:
        assert pm.get("rollout_backend", "hf") is HFRollout
    assert isinstance(HFRollout(model, tok, _cfg()), RolloutBackend)


def test_responses_stop_at_eos_and_are_masked_after_it():
    lm = CountingLM(vocab=10, eos=1)
    roll = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=8))
    out = roll.generate(left_padded_batch([[3, 5], [7], [4, 9]]), greedy=True)
    # 5 -> 6 7 8 9 0 1(eos); 7 -> 8 9 0 1(eos); 9 -> 0 1(eos)
    assert out["responses"].tolist() == [[6, 7, 8, 9, 0, 1, 0, 0], [8, 9, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert out["response_mask"].tolist() == [
        [1, 1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
    ]
    assert out["prompts"].tolist() == [[3, 5], [0, 7], [4, 9]]
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    assert out["attention_mask"].tolist()[1] == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert out["position_ids"].tolist()[1] == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert out["position_ids"].tolist()[0] == list(range(10))
    # log-probs: zero outside the mask, and log_softmax of the one-hot*10 logits inside it
    lp_top = -torch.log1p(torch.tensor(9.0) * torch.exp(torch.tensor(-10.0)))
    lp = out["rollout_log_probs"]
    assert torch.allclose(lp[out["response_mask"] == 1], lp_top.expand(int(out["response_mask"].sum())), atol=1e-6)
    assert (lp[out["response_mask"] == 0] == 0).all()
    # generation stops once every row has ended: one prompt pass + 5 single-token steps
    assert len(lm.calls) == 6 and lm.calls[1]["shape"] == (3, 1)
    assert out.non_tensors["uid"].tolist() == ["p0", "p1", "p2"] and out.meta_info["note"] == "kept"


def test_positions_continue_after_the_prompt_during_decoding():
    lm = CountingLM()
    HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=3)).generate(
        left_padded_batch([[4, 5], [6]]), greedy=True
    )
    assert lm.calls[0]["position_ids"].tolist() == [[0, 1], [0, 0]]
    assert lm.calls[1]["position_ids"].tolist() == [[2], [1]]
    assert lm.calls[2]["position_ids"].tolist() == [[3], [2]]
    assert lm.calls[2]["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]


def test_shared_left_padding_is_trimmed_before_the_forward():
    lm = CountingLM()
    batch = left_padded_batch([[4, 5], [6]])
    padded = DataProto.from_dict(
        tensors={k: torch.cat([torch.zeros(2, 3, dtype=torch.long), v], dim=1) for k, v in batch.tensors.items()}
    )
    out = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=2)).generate(
        padded, greedy=True
    )
    assert lm.calls[0]["shape"] == (2, 2)
    assert out["prompts"].shape == (2, 5) and out["input_ids"].shape == (2, 7)


def test_micro_batches_and_train_mode_is_restored():
    lm = CountingLM()
    lm.train()
    roll = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=2, micro_batch_size=2))
    out = roll.generate(left_padded_batch([[3], [4], [5], [6], [7]]), greedy=True)
    assert [c["shape"][0] for c in lm.calls if c["shape"][1] == 1 and c["position_ids"][0, 0] == 0] == [2, 2, 1]
    assert all(c["training"] is False for c in lm.calls)
    assert lm.training is True
    assert out["responses"][:, 0].tolist() == [4, 5, 6, 7, 8]


def test_n_repeats_prompts_interleaved():
    lm = CountingLM()
    out = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=1)).generate(
        left_padded_batch([[3], [6]]), greedy=True, n=2
    )
    assert out["responses"][:, 0].tolist() == [4, 4, 7, 7]
    assert out.non_tensors["uid"].tolist() == ["p0", "p0", "p1", "p1"]


def test_finished_rows_leave_the_decoding_batch(monkeypatch):
    monkeypatch.setattr(hf_module, "_COMPACT_AT", 0.25)
    lm = CountingLM(vocab=10, eos=1)
    out = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=8)).generate(
        left_padded_batch([[3, 5], [7], [4, 9]]), greedy=True
    )
    # row 2 ends at step 1 and row 1 at step 3; each time at least a quarter of the batch has ended
    assert [c["shape"] for c in lm.calls] == [(3, 2), (3, 1), (2, 1), (2, 1), (1, 1), (1, 1)]
    assert lm.caches[0].selections == [[0, 1], [0]]
    assert lm.calls[2]["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert lm.calls[4]["position_ids"].tolist() == [[5]] and lm.calls[4]["input_ids"].tolist() == [[9]]
    assert out["responses"].tolist() == [[6, 7, 8, 9, 0, 1, 0, 0], [8, 9, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert out["response_mask"].sum(-1).tolist() == [6, 4, 2]


def test_finished_rows_stay_until_enough_have_ended(monkeypatch):
    monkeypatch.setattr(hf_module, "_COMPACT_AT", 0.5)
    lm = CountingLM(vocab=10, eos=1)
    HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=8)).generate(
        left_padded_batch([[3, 5], [7], [4, 9]]), greedy=True
    )
    # one ended row of three is not yet half; two of three are, and they leave together
    assert [c["shape"][0] for c in lm.calls] == [3, 3, 3, 3, 1, 1]
    assert lm.caches[0].selections == [[0]]


def test_identical_prompts_are_prefilled_once():
    lm = CountingLM()
    batch = left_padded_batch([[3, 5], [7], [3, 5], [7], [6], [3, 5]])
    out = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=3)).generate(
        batch, greedy=True
    )
    assert lm.calls[0]["shape"] == (3, 2)
    assert sorted(lm.calls[0]["input_ids"].tolist()) == [[0, 6], [0, 7], [3, 5]]
    inverse = lm.caches[0].selections[0]  # the cache rows are copied out to every prompt row
    assert [lm.calls[0]["input_ids"][i].tolist() for i in inverse] == batch["input_ids"].tolist()
    assert lm.calls[1]["shape"] == (6, 1)
    assert out["responses"].tolist() == [[6, 7, 8], [8, 9, 0], [6, 7, 8], [8, 9, 0], [7, 8, 9], [6, 7, 8]]


def test_a_cache_that_cannot_select_rows_still_decodes_every_row():
    lm = CountingLM(vocab=10, eos=1, selectable_cache=False)
    out = HFRollout(lm, SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg(max_new_tokens=8)).generate(
        left_padded_batch([[4, 9], [7], [4, 9]]), greedy=True
    )
    # the distinct-prompt pass is run, its cache cannot be copied out, so every row is prefilled
    assert [c["shape"] for c in lm.calls[:3]] == [(2, 2), (3, 2), (3, 1)]
    assert all(c["shape"][0] == 3 for c in lm.calls[1:])
    assert out["responses"].tolist() == [[0, 1, 0, 0, 0, 0, 0, 0], [8, 9, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]


def test_unknown_override_and_missing_tensors():
    roll = HFRollout(CountingLM(), SimpleNamespace(eos_token_id=1, pad_token_id=0), _cfg())
    with pytest.raises(TypeError, match="unknown sampling override.*'temp'"):
        roll.generate(left_padded_batch([[3]]), temp=0.5)
    with pytest.raises(KeyError, match="attention_mask"):
        roll.generate(DataProto.from_dict(tensors={"input_ids": torch.ones(1, 2, dtype=torch.long)}))


def test_a_model_without_eos_is_refused():
    lm = CountingLM()
    lm.generation_config = SimpleNamespace(eos_token_id=None)
    with pytest.raises(ValueError, match="EOS"):
        HFRollout(lm, SimpleNamespace(eos_token_id=None, pad_token_id=0), _cfg())


# -- sampling ---------------------------------------------------------------------------------------


def test_a_non_finite_distribution_is_a_one_line_error_suggesting_the_guard():
    from armor_core.errors import NonFiniteError

    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    for top_p in (1.0, 0.9):
        with pytest.raises(NonFiniteError, match=r"next-token distribution holds NaN or inf .* non_finite guard"):
            sample_next_token(logits, greedy=False, temperature=1.0, top_p=top_p)


def test_top_k_and_top_p_truncate_and_the_log_probs_are_those_drawn_with():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(400, 1)
    torch.manual_seed(0)
    tokens, lp, kept = sample_next_token(logits, greedy=False, temperature=1.0, top_p=0.6, keep=True)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 < 0.6, so token 1 is needed; token 2 is not
    # the log-prob the token was drawn with: renormalised over the kept set {0, 1} (mass 0.8)
    assert torch.allclose(lp, torch.log(torch.tensor([0.5, 0.3]) / 0.8)[tokens], atol=1e-6)
    assert kept[0].tolist() == [[0, 1]] * 400 and torch.allclose(kept[1], torch.tensor(0.8).log().expand(400))
    tokens, _, kept = sample_next_token(logits, greedy=False, temperature=1.0, top_p=0.5)
    assert set(tokens.tolist()) == {0}  # the mass before token 1 already reaches 0.5
    assert kept[0].shape == (400, 0), "without keep no set is returned, only its mass"
    tokens, lp, _ = sample_next_token(logits, greedy=False, temperature=1.0, top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    tokens, lp, kept = sample_next_token(logits, greedy=False, temperature=0.5, top_k=1, keep=True)
    assert set(tokens.tolist()) == {0} and kept[0].tolist() == [[0]] * 400
    # one token kept: drawn with probability 1; its untruncated mass at T=0.5 is p^2 / sum p^2 = 0.25 / 0.38
    assert torch.allclose(lp, torch.zeros(400), atol=1e-6)
    assert torch.allclose(kept[1], torch.log(torch.tensor(0.25 / 0.38)).expand(400), atol=1e-5)
    _, _, kept = sample_next_token(logits, greedy=False, temperature=1.0)
    assert kept is None, "untruncated sampling has no kept set"


def test_sampling_frequencies_follow_the_tempered_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(20000, 1)
    torch.manual_seed(1)
    tokens, _, _ = sample_next_token(logits, greedy=False, temperature=1.0)
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_greedy_is_deterministic_and_ignores_the_rng(model, tok, prompts):
    roll = HFRollout(model, tok, _cfg())
    torch.manual_seed(0)
    a = roll.generate(prompts, greedy=True)
    torch.manual_seed(123)
    b = roll.generate(prompts, do_sample=False)
    assert torch.equal(a["responses"], b["responses"])
    c = roll.generate(prompts, temperature=0.0)
    assert torch.equal(a["responses"], c["responses"])


def test_sampling_is_reproducible_from_the_global_seed(model, tok, prompts):
    roll = HFRollout(model, tok, _cfg(temperature=1.0))
    torch.manual_seed(7)
    a = roll.generate(prompts, n=4)
    torch.manual_seed(7)
    b = roll.generate(prompts, n=4)
    torch.manual_seed(8)
    c = roll.generate(prompts, n=4)
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["rollout_log_probs"], b["rollout_log_probs"])
    assert not torch.equal(a["responses"], c["responses"])


@pytest.mark.parametrize("temperature,micro_batch_size", [(1.0, 256), (0.7, 2)])
def test_log_probs_equal_a_full_forward_pass(model, tok, prompts, temperature, micro_batch_size):
    roll = HFRollout(model, tok, _cfg(temperature=temperature, micro_batch_size=micro_batch_size))
    torch.manual_seed(0)
    out = roll.generate(prompts, n=3)
    R = out["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits
    manual = torch.log_softmax(logits[:, -R - 1 : -1].float() / temperature, dim=-1)
    manual = manual.gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1) * out["response_mask"]
    assert torch.allclose(out["rollout_log_probs"], manual, atol=1e-4)
    assert (out["rollout_log_probs"] <= 0).all()


@pytest.mark.parametrize("arch", ["qwen3", "deepseek_v3"])
def test_log_probs_match_a_full_forward_for_other_architectures(arch, tok, prompts):
    # DeepSeek-V3's latent-attention cache and MoE routing take the same incremental path
    model = build_tiny_model(arch, len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    torch.manual_seed(0)
    out = HFRollout(model, tok, _cfg(temperature=1.0)).generate(prompts)
    R = out["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits
    manual = (
        torch.log_softmax(logits[:, -R - 1 : -1].float(), dim=-1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    )
    assert torch.allclose(out["rollout_log_probs"], manual * out["response_mask"], atol=1e-4)


def _rows(batch: DataProto, order: list[int]) -> DataProto:
    return DataProto.from_dict(tensors={k: v[order] for k, v in batch.tensors.items()})


def _full_forward_log_probs(model, out, temperature: float = 1.0) -> torch.Tensor:
    R = out["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits
    manual = torch.log_softmax(logits[:, -R - 1 : -1].float() / temperature, dim=-1)
    return manual.gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1) * out["response_mask"]


def test_duplicated_prompts_in_any_order_decode_like_unique_prompts(model, tok, prompts):
    order = [2, 0, 3, 0, 1, 2, 2, 3, 1, 0]
    roll = HFRollout(model, tok, _cfg())
    unique = roll.generate(prompts, greedy=True)
    dup = roll.generate(_rows(prompts, order), greedy=True)
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(dup[key], unique[key][order]), key
    assert torch.allclose(dup["rollout_log_probs"], unique["rollout_log_probs"][order], atol=1e-5)


def test_dropping_finished_rows_keeps_greedy_outputs(monkeypatch):
    # the trained built-in model answers with 1-3 digits and then EOS, so rows end at different steps
    path = resolve_model_path("builtin:arithmetic-tiny")
    model, tok = load_model(path, "float32"), load_tokenizer(path)
    ids, mask, pos, _ = encode_prompts(tok, ["1+2=", "12+34=", "99+9=", "5+5=", "40+2=", "7+80="], max_length=16)
    batch = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    roll = HFRollout(model, tok, _cfg(max_new_tokens=8))
    monkeypatch.setattr(hf_module, "_COMPACT_AT", float("inf"))
    kept = roll.generate(batch, greedy=True, n=2)
    monkeypatch.setattr(hf_module, "_COMPACT_AT", 0.0)  # drop rows as soon as any has ended
    batch_sizes, forward = [], model.forward

    def counting_forward(**inputs):
        batch_sizes.append(inputs["input_ids"].shape[0])
        return forward(**inputs)

    monkeypatch.setattr(model, "forward", counting_forward)
    dropped = roll.generate(batch, greedy=True, n=2)
    # 6 distinct prompts prefilled, then 12 rows decoded, fewer once the shortest answers end
    assert batch_sizes[:2] == [6, 12] and batch_sizes[-1] < 12
    assert len(set(kept["response_mask"].sum(-1).tolist())) > 1
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(dropped[key], kept[key]), key
    assert torch.allclose(dropped["rollout_log_probs"], kept["rollout_log_probs"], atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "deepseek_v3"])
def test_log_probs_match_a_full_forward_with_shared_prompts_and_early_stops(arch, tok, prompts):
    model = build_tiny_model(arch, len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    batch = _rows(prompts, [1, 3, 1, 0, 2, 3, 1])
    # the last row has row 0's tokens and mask but a gap before its last position (RoPE sees only
    # position differences, so a uniform shift would not tell): it must not share row 0's prefill
    gapped = {k: v[:1].clone() for k, v in batch.tensors.items()}
    gapped["position_ids"][0, -1] += 3
    batch = DataProto.from_dict(tensors={k: torch.cat([v, gapped[k]]) for k, v in batch.tensors.items()})
    torch.manual_seed(0)
    out = HFRollout(model, tok, _cfg(temperature=1.0, micro_batch_size=12)).generate(batch, n=4)
    lengths = out["response_mask"].sum(-1)
    assert lengths.min() < out["responses"].shape[1] and lengths.max() == out["responses"].shape[1]
    assert torch.allclose(out["rollout_log_probs"], _full_forward_log_probs(model, out), atol=1e-4)
    assert (out["rollout_log_probs"][out["response_mask"] == 0] == 0).all()


# -- weights ----------------------------------------------------------------------------------------


def test_update_weights_loads_new_weights_into_a_separate_copy(tok, prompts):
    actor = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=1)
    other = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=2)
    expected = HFRollout(actor, tok, _cfg()).generate(prompts, greedy=True)
    roll = HFRollout(other, tok, _cfg())
    before = roll.generate(prompts, greedy=True)
    assert not torch.allclose(before["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-3)
    # names as a DDP-wrapped actor sends them
    roll.update_weights((f"module.{k}", v) for k, v in actor.state_dict().items())
    after = roll.generate(prompts, greedy=True)
    assert torch.equal(after["responses"], expected["responses"])
    assert torch.allclose(after["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-6)
    assert other.lm_head.weight.data_ptr() != actor.lm_head.weight.data_ptr()  # copied, not aliased


def test_a_tied_models_weights_load_and_are_checked_under_both_names(tok, prompts):
    # a trainer's full state dict (FSDP2's, gathered) names the tied head as well as the embedding
    def tied(seed):
        return build_tiny_model(
            "qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=seed, tie_word_embeddings=True
        )

    actor, other = tied(1), tied(2)
    state = {**actor.state_dict(), "lm_head.weight": actor.lm_head.weight}
    roll = HFRollout(other, tok, _cfg())
    roll.update_weights(state.items())
    expected = HFRollout(actor, tok, _cfg()).generate(prompts, greedy=True)
    assert torch.equal(roll.generate(prompts, greedy=True)["responses"], expected["responses"])
    assert set(roll.weight_sums(["lm_head.weight", "model.embed_tokens.weight"])) == {
        "lm_head.weight",
        "model.embed_tokens.weight",
    }


def test_update_weights_from_the_colocated_actor_copies_nothing(model, tok):
    roll = HFRollout(model, tok, _cfg())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    roll.update_weights(model.state_dict().items())
    assert all(torch.equal(v, before[k]) and v.data_ptr() == ptrs[k] for k, v in model.state_dict().items())


def test_update_weights_errors_name_the_tensor(model, tok):
    roll = HFRollout(copy.deepcopy(model), tok, _cfg())
    with pytest.raises(KeyError, match="lm_head.weightt.*Did you mean 'lm_head.weight'"):
        roll.update_weights([("lm_head.weightt", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"'lm_head.weight' has shape \(2, 2\)"):
        roll.update_weights([("lm_head.weight", torch.zeros(2, 2))])
