"""Shared fixtures. Ray-based tests share one local cluster: starting one costs ~5 s on this machine."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny models gain nothing from a second, and on a shared
    2-core CI machine a second OpenMP thread mostly spins waiting for a core."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


#: a tiny MCP server on the real ``mcp`` SDK (stdio; ``--http PORT`` for streamable HTTP): ``recipe:tools``' lookup
#: tool served over MCP, and tools that show the process, hang and crash
MCP_TABLE_SERVER = os.path.join(os.path.dirname(__file__), "plugins", "environments", "mcp_servers", "table_server.py")


@pytest.fixture(scope="session")
def mcp_table_server() -> dict:
    """An ``environment_kwargs.mcp_servers`` entry that starts ``MCP_TABLE_SERVER`` over stdio, the row's table hidden;
    a test adds its own keys."""
    import sys

    return {"name": "tables", "command": sys.executable, "args": [MCP_TABLE_SERVER], "hidden": ["table"]}


#: the entry points that register the built-in algorithms (estimators, policy losses, KL estimators, aggregations)
ALGORITHM_PLUGINS = {
    "grpo",
    "gae",
    "rloo",
    "reinforce_plus_plus",
    "opo",
    "pass_at_k",
    "grpo_passk",
    "ppo_clip",
    "gspo",
    "cispo",
    "sapo",
    "geo_mean",
    "gpg",
    "dppo",
    "kl_estimators",
    "loss_aggregations",
}


@pytest.fixture(scope="module")
def pm():
    """The real plugin manager over the real entry points with only the built-in algorithm plugins:
    every other plugin is blocked, so an algorithm test does not depend on other packages importing."""
    import importlib.metadata

    from armor_core.plugins import PluginManager

    return PluginManager(disabled={e.name for e in importlib.metadata.entry_points(group="armor")} - ALGORITHM_PLUGINS)


@pytest.fixture(scope="module")
def chat_tokenizer():
    """A char-level tokenizer over printable ASCII with an append-only chat template (``<|user|>``,
    ``<|assistant|>``), as multi-turn rollouts need: game text and observations are tokens, never ``<unk>``."""
    from armor_core.train.sft_traces import build_chat_char_tokenizer

    return build_chat_char_tokenizer()


@pytest.fixture(scope="module")
def chat_model(chat_tokenizer):
    """A tiny random Qwen2 over ``chat_tokenizer``'s vocabulary, stopping at its end-of-turn token."""
    from armor_core.models.loading import build_tiny_model

    model = build_tiny_model("qwen2", len(chat_tokenizer), hidden_size=64, num_layers=1, num_heads=2, seed=0)
    model.generation_config.eos_token_id = chat_tokenizer.eos_token_id
    return model.eval()
