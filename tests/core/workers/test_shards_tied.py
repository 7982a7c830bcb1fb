"""A sharded checkpoint of a model with a tied head, on one process (``actor.checkpoint_format=sharded``): the
shared tensor is written once, under the embedding's name, and reads back into both names; ``armor export``
gives transformers a model whose head is that embedding."""

from __future__ import annotations

import pytest
import torch
from test_rollback_point import _batch  # an update's batch: responses, mask, advantages

from armor_core.config.schema import load_config, to_dict
from armor_core.models.tiny import build_char_tokenizer, build_tiny_model


def _worker(model_dir, run_dir):
    from armor_core.workers.actor.worker import ActorWorker

    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "actor.checkpoint_format=sharded",
            "guard.guards=[{name: non_finite}]",
            "trainer.loggers=[]",
            f"trainer.run_dir={run_dir}",
        ],
    )
    return ActorWorker(to_dict(cfg), rank=0, world_size=1)


@pytest.mark.filterwarnings("ignore:.*has no manifest.json")  # a worker's own checkpoint, not a run's
def test_a_tied_head_is_written_once_and_read_back_into_both_names(tmp_path):
    import torch.distributed.checkpoint as dcp

    from armor_core.cli.export import export

    tok = build_char_tokenizer("0123456789+=-*/()")  # ids up to 18, as the batch holds
    model = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    w = _worker(tmp_path / "model", tmp_path / "run")
    w.update_actor(_batch(), step=1)
    w.save_checkpoint(str(tmp_path / "ckpt"))
    keys = set(dcp.FileSystemReader(str(tmp_path / "ckpt" / "actor_shards")).read_metadata().state_dict_metadata)
    assert "model.model.embed_tokens.weight" in keys and "model.lm_head.weight" not in keys

    fresh = _worker(tmp_path / "model", tmp_path / "run2")
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    for (k, v), (k2, v2) in zip(w.model.state_dict().items(), fresh.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    assert fresh.model.lm_head.weight.data_ptr() == fresh.model.model.embed_tokens.weight.data_ptr()  # still tied
    state = {p: s for p, s in zip(w.model.parameters(), w.optimizer.state.values())}
    for p, q in zip(w.model.parameters(), fresh.model.parameters()):
        assert torch.equal(fresh.optimizer.state[q]["exp_avg"], state[p]["exp_avg"])

    export(tmp_path / "ckpt", tmp_path / "out", merge=False)
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(exported.lm_head.weight, w.model.model.embed_tokens.weight.detach())


def test_a_sync_sends_a_tied_head_once_under_the_embeddings_name():
    from armor_core.models.state_buckets import full_state_buckets

    model = build_tiny_model("qwen2", 19, hidden_size=64, num_layers=2, num_heads=2, tie_word_embeddings=True)
    sent = [name for bucket in full_state_buckets(model, 1 << 12) for name in bucket]
    assert "model.embed_tokens.weight" in sent and "lm_head.weight" not in sent
    assert sorted(sent) == sorted(set(model.state_dict()) - {"lm_head.weight"})
