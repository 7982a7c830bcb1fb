"""The plugin manager: catalog, duplicates, unknown names, blocking, misspelled hooks, and every hook."""

from __future__ import annotations

import types

import pytest
import torch

from armor_core import AdvantageEstimator, PolicyLoss, RewardResult, Verdict, hookimpl
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.schema import ConfigError, load_config
from armor_core.plugins import DuplicatePluginError, PluginError, PluginManager, UnknownPluginError, get_plugin
from armor_core.testing import (
    check_advantage_estimator,
    check_policy_loss,
    check_reward_domain,
    isolated_plugin_manager,
    registered,
)


def centered_advantage(token_level_rewards, response_mask, index):
    """Score minus the batch mean, broadcast over the response."""
    scores = token_level_rewards.sum(-1)
    adv = (scores - scores.mean()).unsqueeze(-1) * response_mask
    return adv, adv


class AllHooks:
    """One implementation for every hook in hookspecs.py."""

    @hookimpl
    def armor_register_advantage_estimators(self, register):
        register("centered", centered_advantage)

    @hookimpl
    def armor_register_policy_losses(self, register):
        def vanilla_pg(log_prob, old_log_prob, advantages, response_mask):
            return -advantages * log_prob * response_mask, {"pg_n": float(response_mask.sum())}

        register("vanilla_pg", vanilla_pg)

    @hookimpl
    def armor_register_kl_estimators(self, register):
        register("sq", lambda log_prob, ref_log_prob: (log_prob - ref_log_prob) ** 2)

    @hookimpl
    def armor_register_loss_aggregations(self, register):
        def plain_sum(loss_mat, response_mask, *, global_num_tokens=None, global_num_seqs=None, norm_constant=None):
            return (loss_mat * response_mask).sum()

        register("plain-sum", plain_sum)

    @hookimpl
    def armor_register_reward_domains(self, register):
        register(
            "exact",
            lambda prompt, response, gt, extra: RewardResult(float(response.strip() == gt), {"len": len(response)}),
        )

    @hookimpl
    def armor_register_stability_guards(self, register):
        class AlwaysSkip:
            def __init__(self, reason="test"):
                self.reason = reason

            def observe(self, stage, stats, step):
                return Verdict("skip", self.reason)

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass

        register("always_skip", AlwaysSkip)

    @hookimpl
    def armor_register_rollout_backends(self, register):
        class EchoRollout:
            def __init__(self, model, tokenizer, config):
                self.model = model

            def generate(self, prompts, **kw):
                return prompts

            def update_weights(self, named_tensors):
                pass

        register("echo", EchoRollout)

    @hookimpl
    def armor_register_tasks(self, register):
        def count(split, size, seed):
            return [{"prompt": f"{i}+1=", "data_source": "exact", "ground_truth": str(i + 1)} for i in range(size)]

        register("count", count)

    @hookimpl
    def armor_register_metric_trackers(self, register):
        class ListTracker:
            def __init__(self, run_dir, config):
                self.rows = []

            def log(self, metrics, step):
                self.rows.append((step, dict(metrics)))

            def close(self):
                pass

        register("list", ListTracker)


def test_every_hook_registers_and_resolves():
    with isolated_plugin_manager() as pm:
        pm.register(AllHooks(), name="all_hooks")
        got = {e.kind: e.name for e in pm.entries()}
    assert got == {
        "advantage_estimator": "centered",
        "policy_loss": "vanilla_pg",
        "kl_estimator": "sq",
        "loss_aggregation": "plain-sum",
        "reward_domain": "exact",
        "stability_guard": "always_skip",
        "rollout_backend": "echo",
        "task": "count",
        "metric_tracker": "list",
    }


def test_plain_functions_are_wrapped_and_usable():
    with registered(AllHooks(), load_entrypoints=False):
        est = get_plugin("advantage_estimator", "centered")
        assert isinstance(est, AdvantageEstimator) and not est.requires_critic
        assert est.description == "Score minus the batch mean, broadcast over the response."
        adv, _ = check_advantage_estimator(est)
        # hand-computed: scores [1,0,1,1,.5,.5,.5,0] have mean 0.5625
        assert adv[0, 0].item() == pytest.approx(0.4375)
        check_policy_loss(get_plugin("policy_loss", "vanilla_pg"))
        check_reward_domain(get_plugin("reward_domain", "exact"), [("1+1=", " 2", "2", 1.0), ("1+1=", "3", "2", 0.0)])
        kl = get_plugin("kl_estimator", "sq").fn(torch.tensor([1.0]), torch.tensor([3.0]))
        assert kl.item() == 4.0
        rows = get_plugin("task", "count").fn("train", 3, 0)
        assert [r["ground_truth"] for r in rows] == ["1", "2", "3"]


def test_registered_plugin_disappears_after_the_block():
    with registered(AllHooks()):
        get_plugin("advantage_estimator", "centered")
    with pytest.raises(UnknownPluginError):
        get_plugin("advantage_estimator", "centered")


def test_duplicate_name_names_both_providers():
    other = types.SimpleNamespace()

    @hookimpl
    def armor_register_advantage_estimators(register):
        register("centered", centered_advantage)

    other.armor_register_advantage_estimators = armor_register_advantage_estimators
    with isolated_plugin_manager() as pm:
        pm.register(AllHooks(), name="first_pack")
        pm.register(other, name="second_pack")
        with pytest.raises(DuplicatePluginError) as e:
            pm.get("advantage_estimator", "centered")
    msg = str(e.value)
    assert (
        "'centered'" in msg
        and "first_pack" in msg
        and "second_pack" in msg
        and "ARMOR_DISABLE_PLUGINS=second_pack" in msg
    )


def test_unknown_name_lists_available_and_nearest():
    with isolated_plugin_manager() as pm:
        pm.register(AllHooks())
        with pytest.raises(UnknownPluginError) as e:
            pm.get("reward_domain", "exakt", where="reward.domain_map.foo")
    msg = str(e.value)
    assert "unknown reward_domain 'exakt'" in msg and "Did you mean 'exact'?" in msg and "Available: exact" in msg
    assert "reward.domain_map.foo" in msg


def test_unknown_kind_is_an_error():
    with isolated_plugin_manager() as pm, pytest.raises(ValueError, match="Did you mean 'reward_domain'"):
        pm.names("reward_domains")


def test_misspelled_hook_fails_at_registration():
    class Typo:
        @hookimpl
        def armor_register_advantage_estimator(self, register):  # missing "s"
            register("x", centered_advantage)

    with (
        isolated_plugin_manager() as pm,
        pytest.raises(PluginError, match="did you mean 'armor_register_advantage_estimators'"),
    ):
        pm.register(Typo())


def test_unmarked_armor_function_is_still_checked():
    # no @hookimpl: a forgotten marker plus a typo must not fail silently either
    mod = types.SimpleNamespace(armor_register_reward_domain=lambda register: None)
    with isolated_plugin_manager() as pm, pytest.raises(PluginError, match="armor_register_reward_domains"):
        pm.register(mod)


def test_bad_registrations_are_refused():
    class BadName:
        @hookimpl
        def armor_register_tasks(self, register):
            register("My Task", lambda split, size, seed: [])

    class NotCallable:
        @hookimpl
        def armor_register_tasks(self, register):
            register("task_x", 42)

    for plugin, match in ((BadName(), "names are lowercase"), (NotCallable(), "expected a function")):
        with isolated_plugin_manager() as pm:
            pm.register(plugin, name="bad")
            with pytest.raises(PluginError, match=match):
                pm.names("task")


def test_disable_env_blocks_installed_plugins(monkeypatch):
    monkeypatch.setenv("ARMOR_DISABLE_PLUGINS", "non_finite, trackers")
    pm = PluginManager()
    assert "non_finite" not in pm.names("stability_guard")
    assert pm.names("metric_tracker") == []
    assert {"non_finite", "trackers"} <= pm.disabled
    # a name no entry point has blocks nothing: an error, not silence
    monkeypatch.setenv("ARMOR_DISABLE_PLUGINS", "kl")
    with pytest.raises(PluginError, match=r"'kl' is no installed plugin .*installed: .*kl_estimators.*write kind:name"):
        PluginManager()


def test_disable_env_blocks_one_implementation_by_kind_and_name(monkeypatch):
    # the entry point "kl_estimators" registers the KL estimators and "kl_guard" the guard named "kl": kind:name says
    # which
    monkeypatch.setenv("ARMOR_DISABLE_PLUGINS", "stability_guard:kl, kl_estimator:k3")
    pm = PluginManager()
    assert "kl" not in pm.names("stability_guard") and "entropy" in pm.names("stability_guard")
    assert "k3" not in pm.names("kl_estimator") and "k1" in pm.names("kl_estimator")
    with pytest.raises(UnknownPluginError, match="unknown stability_guard 'kl'"):
        pm.get("stability_guard", "kl")
    monkeypatch.setenv("ARMOR_DISABLE_PLUGINS", "guard:kl")
    with pytest.raises(PluginError, match="'guard' in 'guard:...' is not a plugin kind; kinds are .*stability_guard"):
        PluginManager()


def test_builtins_come_from_entry_points_with_their_distribution():
    pm = PluginManager()
    entry = pm.entry("stability_guard", "non_finite")
    assert (entry.plugin, entry.distribution) == ("non_finite", "armor-rl")
    assert entry.version == __import__("armor_core").__version__


def test_config_path_gives_the_same_error_as_get_plugin():
    cfg = load_config(None, ["algorithm.adv_estimator=centred"])
    with registered(AllHooks()), pytest.raises(ConfigError) as e:
        validate_plugins(cfg)
    assert "algorithm.adv_estimator" in str(e.value) and "Did you mean 'centered'?" in str(e.value)


class _GuardClass:
    def observe(self, stage, stats, step):
        return None


@pytest.mark.parametrize(
    "hook, obj, match",
    [
        # a guard class registered as an estimator, and another kind's wrapper, are refused at registration
        ("armor_register_advantage_estimators", _GuardClass, r"as the class _GuardClass; expected a function"),
        ("armor_register_stability_guards", PolicyLoss(fn=lambda *a: a), r"as a PolicyLoss; expected a class"),
        ("armor_register_advantage_estimators", PolicyLoss(fn=lambda *a: a), r"as a PolicyLoss; expected Advantage"),
    ],
)
def test_an_implementation_of_another_kind_is_refused(hook, obj, match):
    plugin = types.SimpleNamespace(**{hook: hookimpl(lambda register: register("wrong_kind", obj))})
    with isolated_plugin_manager() as pm, pytest.raises(PluginError, match=match):
        pm.register(plugin)
        pm.names("advantage_estimator")  # builds the catalog, which calls the hooks


def _answer_is_a_number(ground_truth):  # a plugin author's first try: one argument, where two are passed
    int(ground_truth)


def test_a_ground_truth_check_that_cannot_take_the_row_is_refused_naming_the_plugin():
    from armor_core import RewardDomain

    domain = RewardDomain(lambda p, r, g, e: 1.0, validate_ground_truth=_answer_is_a_number)
    plugin = types.SimpleNamespace(armor_register_reward_domains=hookimpl(lambda register: register("num", domain)))
    with isolated_plugin_manager() as pm, pytest.raises(PluginError) as e:
        pm.register(plugin, name="my_pack")
        pm.names("reward_domain")
    said = str(e.value)
    assert "plugin 'my_pack'" in said and "reward_domain 'num'" in said and "_answer_is_a_number" in said
    assert "validate_ground_truth(ground_truth, extra)" in said and "\n" not in said
