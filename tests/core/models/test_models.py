"""Model and tokenizer helpers: paths, char tokenizer, tiny models, save/load, prompt encoding."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from armor_core.models.loading import (
    ModelPathError,
    build_char_tokenizer,
    build_tiny_model,
    encode_prompts,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

ARITH = "0123456789+="  # sorted: '+' < digits < '=', so ids: specials 0-3, '+' 4, '0'..'9' 5..14, '=' 15


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(ARITH)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


def _qwen2_param_count(vocab: int, hidden: int = 128, layers: int = 4, inter: int = 512) -> int:
    # per layer: q, k, v with bias (3 * (h*h + h)), o without bias (h*h), gate/up/down (3*h*I), two RMSNorms (2h)
    per_layer = 3 * (hidden * hidden + hidden) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden  # untied embed + lm_head, final norm


# -- char tokenizer ---------------------------------------------------------------------------------


def test_char_tokenizer_ids_and_round_trip(tok):
    assert len(tok) == 4 + len(ARITH)
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("85")["input_ids"]
    assert ids == [2, 13, 10]  # <bos>, '8', '5'
    assert tok.decode(ids, skip_special_tokens=True) == "85"  # not "8 5": the Fuse decoder
    assert tok.decode(tok("12+34=")["input_ids"], skip_special_tokens=True) == "12+34="
    assert tok("7", add_special_tokens=False)["input_ids"] == [12]
    assert tok("7a")["input_ids"] == [2, 12, 3]  # unknown character -> <unk>
    assert tok.padding_side == "left"


def test_char_tokenizer_keeps_spaces_and_newlines():
    t = build_char_tokenizer("ab \n")
    ids = t("a b\n", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 and t.unk_token_id not in ids
    assert t.decode(ids) == "a b\n"


def test_char_tokenizer_takes_every_character_of_its_input():
    t = build_char_tokenizer(["ba", "c", "a"])
    assert len(t) == 4 + 3
    assert t("abc", add_special_tokens=False)["input_ids"] == [4, 5, 6]


def test_tokenizer_save_and_load_round_trip(tok, tmp_path):
    model = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.padding_side == "left" and loaded.pad_token_id == 0 and loaded.eos_token_id == 1
    for text in ("85", "12+34=", "99+99="):
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    # padding_side was saved, so a plain AutoTokenizer (what vLLM uses) pads on the left too, and
    # gives the same ids on the arithmetic alphabet even though it picks Qwen2Tokenizer for qwen2
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert auto.padding_side == "left"
    for text in ("85", "12+34=", "7+0="):
        assert auto(text)["input_ids"] == tok(text)["input_ids"]


def test_load_tokenizer_sets_a_pad_token_when_missing(tmp_path, tok):
    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<eos>", bos_token="<bos>")
    assert bare.pad_token is None
    bare.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token_id == loaded.eos_token_id == 1
    assert loaded.padding_side == "left"


# -- tiny models ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "deepseek_v3"])
def test_tiny_models_build_and_forward(arch, tok):
    model = build_tiny_model(arch, len(tok))
    ids = torch.tensor([tok("12+34=")["input_ids"], tok("99+1=9")["input_ids"]])
    out = model(input_ids=ids)
    assert out.logits.shape == (2, 7, len(tok))
    assert torch.isfinite(out.logits).all()
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model.dtype == torch.float32
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 1.5e6


def test_tiny_qwen2_parameter_count_matches_the_architecture(tok):
    model = build_tiny_model("qwen2", len(tok), hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512)
    assert sum(p.numel() for p in model.parameters()) == _qwen2_param_count(len(tok))
    assert model.config.hidden_size // model.config.num_attention_heads == 32


def test_tiny_deepseek_v3_has_moe_and_latent_attention(tok):
    model = build_tiny_model("deepseek_v3", len(tok), num_layers=2)
    cfg = model.config
    assert cfg.n_routed_experts == 4 and cfg.num_experts_per_tok == 2 and cfg.first_k_dense_replace == 1
    assert cfg.kv_lora_rank == 32 and cfg.q_lora_rank == 64
    assert cfg.qk_nope_head_dim + cfg.qk_rope_head_dim >= 32 and cfg.v_head_dim >= 32
    layer0, layer1 = model.model.layers
    assert not hasattr(layer0.mlp, "experts")  # first_k_dense_replace=1: layer 0 is dense
    assert hasattr(layer1.mlp, "experts") and hasattr(layer1.mlp, "shared_experts")
    assert hasattr(layer1.self_attn, "kv_a_proj_with_mqa")


def test_tiny_model_seed_is_reproducible_and_leaves_the_global_rng_alone(tok):
    state = torch.random.get_rng_state()
    a = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2, seed=3)
    assert torch.equal(state, torch.random.get_rng_state())
    b = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2, seed=3)
    c = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=1, num_heads=2, seed=4)
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_tiny_model_rejects_small_heads_and_unknown_arch(tok):
    with pytest.raises(ValueError, match="head_dim >= 32"):
        build_tiny_model("qwen2", len(tok), hidden_size=128, num_heads=8)
    with pytest.raises(ValueError, match="unknown arch 'llama'"):
        build_tiny_model("llama", len(tok))


@pytest.mark.parametrize("arch", ["qwen2", "deepseek_v3"])
def test_save_pretrained_round_trip_loads_with_plain_transformers(arch, tok, tmp_path):
    model = build_tiny_model(arch, len(tok), hidden_size=64, num_layers=2, num_heads=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ids = torch.tensor([tok("12+34=")["input_ids"]])
    expected = model(input_ids=ids).logits
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(plain(input_ids=ids).logits, expected)
    ours = load_model(tmp_path)
    assert torch.equal(ours(input_ids=ids).logits, expected)
    assert load_model(tmp_path, dtype="bfloat16").dtype == torch.bfloat16


def test_load_model_rejects_unknown_dtype(tmp_path):
    with pytest.raises(ValueError, match="float64"):
        load_model(tmp_path, dtype="float64")


# -- paths ------------------------------------------------------------------------------------------


def test_builtin_model_resolves_and_loads():
    path = resolve_model_path("builtin:arithmetic-tiny")
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    model = load_model("builtin:arithmetic-tiny")
    tok = load_tokenizer("builtin:arithmetic-tiny")
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings is False
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    assert tok.decode(tok("85")["input_ids"], skip_special_tokens=True) == "85"
    assert sum(f.stat().st_size for f in path.iterdir()) < 8 * 2**20  # a few MB


def test_unknown_builtin_lists_the_known_ones():
    with pytest.raises(ModelPathError, match="builtin:arithmetic-tiny"):
        resolve_model_path("builtin:arithmetic-huge")


def test_missing_directory_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelPathError, match=r"does not exist.*never downloads") as e:
        resolve_model_path(str(missing))
    assert str(missing) in str(e.value)


def test_file_instead_of_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_text("x")
    with pytest.raises(ModelPathError, match="is a file"):
        resolve_model_path(f)


def test_directory_without_config_or_tokenizer(tmp_path):
    with pytest.raises(ModelPathError, match="has no config.json"):
        resolve_model_path(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ModelPathError, match="has no tokenizer"):
        resolve_model_path(tmp_path)
    assert resolve_model_path(tmp_path, need_tokenizer=False) == tmp_path
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_model_path(tmp_path) == tmp_path


# -- encode_prompts ---------------------------------------------------------------------------------


def test_encode_prompts_left_pads_with_positions(tok):
    ids, mask, pos, kept = encode_prompts(tok, ["1+2=", "12+34="], max_length=16)
    # "1+2=" -> <bos> 1 + 2 = ; "12+34=" -> <bos> 1 2 + 3 4 =
    assert ids.tolist() == [[0, 0, 2, 6, 4, 7, 15], [2, 6, 7, 4, 8, 9, 15]]
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1] * 7]
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]]
    assert kept == [0, 1]
    assert ids.dtype == mask.dtype == pos.dtype == torch.long


def test_encode_prompts_truncation_modes(tok):
    prompts = ["1+2=", "12+34=", "3="]  # 5, 7 and 3 tokens with <bos>
    ids, mask, _, kept = encode_prompts(tok, prompts, max_length=5, truncation="drop")
    assert kept == [0, 2] and ids.shape == (2, 5)
    ids, _, _, kept = encode_prompts(tok, prompts, max_length=5, truncation="left")
    assert kept == [0, 1, 2]
    assert ids[1].tolist() == [7, 4, 8, 9, 15]  # the last 5 tokens: 2 + 3 4 =
    with pytest.raises(ValueError, match=r"prompt 1 has 7 tokens, more than max_length=5"):
        encode_prompts(tok, prompts, max_length=5, truncation="error")
    ids, mask, pos, kept = encode_prompts(tok, ["12+34="], max_length=3, truncation="drop")
    assert ids.shape == (0, 0) and kept == []


def test_encode_prompts_chat_messages(tok):
    messages = [[{"role": "user", "content": "1+2"}]]
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompts(tok, messages, max_length=16)
    chat_tok = build_char_tokenizer(ARITH)
    chat_tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    )
    ids, _, _, _ = encode_prompts(chat_tok, messages, max_length=16)
    assert ids.tolist() == [[2, 6, 4, 7, 15]]  # the template's <bos>, no second one added


def test_encode_prompts_rejects_other_types(tok):
    with pytest.raises(ValueError, match="prompt 0 is a int"):
        encode_prompts(tok, [3], max_length=8)
    with pytest.raises(ValueError, match="truncation='middle'"):
        encode_prompts(tok, ["1"], max_length=8, truncation="middle")
