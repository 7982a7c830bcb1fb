"""Config loading: defaults, YAML, overrides, and errors that name the key, the value and what is allowed."""

from __future__ import annotations

import dataclasses

import pytest

from armor_core.config.schema import ArmorConfig, ConfigError, help_for, load_config, to_yaml


def test_defaults_yaml_and_overrides_merge_in_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  lr: 1.0e-5\nrollout:\n  n: 4\n")
    cfg = load_config(path, ["rollout.n=16"])
    assert cfg.actor.lr == 1e-5  # from YAML
    assert cfg.rollout.n == 16  # override beats YAML
    assert cfg.actor.clip_ratio_low == 0.2  # default fills the rest
    assert isinstance(cfg, ArmorConfig)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("actor.lrr=1e-5", "unknown config key 'actor.lrr'. Did you mean 'actor.lr'?"),
        ("algoritm.gamma=0.9", "Did you mean 'algorithm'?"),
        ("actor.lr=fast", "invalid value for 'actor.lr'"),
        ("rollout.n=0", "rollout.n=0 is out of range: must be >= 1"),
        ("rollout.top_p=1.5", "rollout.top_p=1.5 is out of range: must be <= 1.0"),
        ("data.truncation=middle", "must be one of ['drop', 'left', 'error']"),
        ("actor.clip_ratio_c=1.0", "actor.clip_ratio_c=1.0 is out of range: must be > 1.0"),
        ("actor.ppo_mini_batch_size=3", "must be a multiple of actor.ppo_mini_batch_size=3"),
        ("actor.lr", "is not key=value"),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert expected in str(e.value)


def test_bad_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  total_step: 5\n")
    with pytest.raises(ConfigError, match="Did you mean 'trainer.total_steps'"):
        load_config(typo)


def test_guard_entries_are_checked():
    with pytest.raises(ConfigError, match=r"guard.guards\[0\] has unknown keys \['parms'\]"):
        load_config(None, ["guard.guards=[{name: non_finite, parms: {}}]"])


def test_every_field_has_help_text():
    missing = [key for key, help_text, _ in help_for() if not help_text.strip()]
    assert missing == []


def test_the_model_help_names_every_built_in_model_and_which_has_a_chat_template():
    import json
    import re

    from armor_core.models.loading import builtin_models, resolve_model_path

    text = dict((key, help_text) for key, help_text, _ in help_for())["model.path"]
    for name in builtin_models():
        folder = resolve_model_path(f"builtin:{name}")
        config = json.loads((folder / "tokenizer_config.json").read_text())
        templated = (folder / "chat_template.jinja").exists() or bool(config.get("chat_template"))
        said = re.search(rf"builtin:{name}\b[^;]*?(has an append-only chat template|have no chat template)", text)
        assert said is not None, f"--help-config's model.path does not say whether builtin:{name} has a chat template"
        assert said.group(1).startswith("has") == templated, name


def test_the_dry_run_plan_names_the_environment_and_each_implementation(capsys):
    from armor_core.cli.run import print_plan
    from armor_core.config.plugin_checks import validate_plugins

    cfg = load_config(None, ["rollout.multi_turn.enable=true"])
    plan = validate_plugins(cfg)
    assert plan["rollout.multi_turn.environment"].__name__ == "ToolsEnvironment"
    print_plan(plan)
    printed = capsys.readouterr().out
    assert "  rollout.multi_turn.environment: ToolsEnvironment\n" in printed
    assert "  algorithm.adv_estimator: compute_grpo_advantage\n" in printed  # the function, not its wrapper


def test_print_round_trip(tmp_path):
    # what --print-config prints loads back as the same config (a saved run can be re-run from it)
    cfg = load_config(None, ["actor.lr=2e-5", "rollout.n=3", "trainer.loggers=[jsonl]"])
    text = to_yaml(cfg)
    assert "lr: 2.0e-05" in text
    path = tmp_path / "printed.yaml"
    path.write_text(text)
    assert dataclasses.asdict(load_config(path)) == dataclasses.asdict(cfg)
    assert dataclasses.asdict(load_config(path)) != dataclasses.asdict(load_config(None))


def test_missing_optional_engine_is_a_config_error_before_any_worker():
    from armor_core import hookimpl
    from armor_core.config.plugin_checks import validate_plugins
    from armor_core.testing import registered

    class NeedsEngine:
        @hookimpl
        def armor_register_rollout_backends(self, register):
            class Fancy:
                @classmethod
                def check_available(cls):
                    raise ImportError("fancy-engine is not installed: pip install fancy-engine")

            register("fancy", Fancy)

    with (
        registered(NeedsEngine()),
        pytest.raises(
            ConfigError, match=r"rollout.backend='fancy': fancy-engine is not installed: pip install fancy-engine"
        ),
    ):
        validate_plugins(load_config(None, ["rollout.backend=fancy"]))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.filter_groups=true", "rollout.n=1"], r"rollout.n=1 samples per prompt always agree"),
        (
            ["algorithm.filter_groups=true", "algorithm.adv_estimator=reinforce_plus_plus"],
            r"adv_estimator='reinforce_plus_plus' does not compare .* \(dr_grpo, grpo, grpo_passk, opo, pass_at_k",
        ),
        (["algorithm.filter_groups=true", "algorithm.adv_estimator=gae"], r"adv_estimator='gae' does not compare"),
        (["algorithm.max_gen_batches=0"], r"algorithm.max_gen_batches=0 is out of range"),
        (["algorithm.rollout_correction=tis"], r"algorithm.rollout_correction='tis' is out of range: must be one of"),
        (["algorithm.rollout_correction_cap=0"], r"algorithm.rollout_correction_cap=0.0 is out of range"),
        (
            ["algorithm.rollout_correction=mask_token", "algorithm.rollout_correction_cap=0.5"],
            r"algorithm.rollout_correction_cap=0.5 with algorithm.rollout_correction=mask_token: .* set the cap to 1",
        ),
        (
            ["algorithm.rollout_correction=mask_seq", "algorithm.rollout_correction_cap=0.99"],
            r"algorithm.rollout_correction_cap=0.99 with algorithm.rollout_correction=mask_seq",
        ),
    ],
)
def test_dynamic_sampling_and_rollout_correction_settings_are_checked(overrides, match):
    from armor_core.config.plugin_checks import validate_plugins

    with pytest.raises(ConfigError, match=match):
        validate_plugins(load_config(None, overrides))


def test_auto_resume_needs_checkpoints_written_during_the_run():
    with pytest.raises(ConfigError, match=r"trainer.resume=auto .* trainer.save_freq=0 writes one only at the end"):
        load_config(None, ["trainer.resume=auto"])
    with pytest.raises(
        ConfigError, match=r"trainer.resume='always' is out of range: must be one of \['never', 'auto'\]"
    ):
        load_config(None, ["trainer.resume=always", "trainer.save_freq=5"])
    assert load_config(None, ["trainer.resume=auto", "trainer.save_freq=5"]).trainer.resume == "auto"
    assert load_config(None, []).trainer.resume == "never"  # a run resumes only when asked, as before the key


def test_a_truncating_correction_may_cap_below_one_a_masking_one_at_one():
    load_config(None, ["algorithm.rollout_correction=tis_token", "algorithm.rollout_correction_cap=0.5"])
    load_config(None, ["algorithm.rollout_correction=mask_token", "algorithm.rollout_correction_cap=1"])


def test_grouped_estimators_pass_with_filter_groups():
    from armor_core.config.plugin_checks import validate_plugins

    for name in ("grpo", "dr_grpo", "rloo", "opo", "reinforce_plus_plus_baseline"):
        validate_plugins(load_config(None, ["algorithm.filter_groups=true", f"algorithm.adv_estimator={name}"]))


def _numeric_keys(cls=ArmorConfig, prefix=""):
    """Every int or float field (Optional ones too), by its dotted key."""
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        if fld.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(fld.default_factory):
            yield from _numeric_keys(fld.default_factory, key + ".")
        elif str(fld.type) in ("int", "float", "Optional[int]", "Optional[float]"):
            yield key


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_numeric_field_rejects_non_finite_values(value):
    keys = list(_numeric_keys())
    assert "rollout.temperature" in keys and "actor.lr" in keys and "reward.failure_score" in keys and len(keys) > 40
    for key in keys:
        with pytest.raises(ConfigError, match=rf"{key}"):
            load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rollout.temperature=nan", "rollout.temperature=nan is not a finite number"),
        ("actor.lr=nan", "actor.lr=nan is not a finite number"),
        ("reward.failure_score=-inf", "reward.failure_score=-inf is not a finite number"),
        ("trainer.total_epochs=-1", "trainer.total_epochs=-1 is out of range: must be >= 1"),
        ("trainer.total_epochs=0", "trainer.total_epochs=0 is out of range: must be >= 1"),
        ("trainer.seed=-1", "trainer.seed=-1 is out of range: must be >= 0"),
        ("trainer.seed=4294967296", "trainer.seed=4294967296 is out of range: must be < 4294967296"),
        ("engine.num_cpus=0", "engine.num_cpus=0 is out of range: must be >= 1"),
        ("actor.betas=[0.9]", "actor.betas=[0.9] has 1 item(s); it takes exactly 2"),
        ("actor.betas=[0.9,0.99,0.999]", "it takes exactly 2"),
        ("actor.betas=[0.9,fast]", "actor.betas[1]='fast' is a str; actor.betas takes numbers"),
        ("actor.betas=[0.9,true]", "actor.betas[1]=True is a bool"),
        ("actor.betas=[0.9,1.0]", "actor.betas[1]=1.0 is out of range: must be < 1.0"),
        ("actor.betas=[-0.1,0.9]", "actor.betas[0]=-0.1 is out of range: must be >= 0.0"),
        ("actor.betas=[0.9,.nan]", "actor.betas[1]=nan is not a finite number"),
        ("trainer.loggers=[jsonl,3]", "trainer.loggers[1]=3 is a int; trainer.loggers takes text"),
        ("data.train_files=[[a.jsonl]]", "data.train_files[0]=['a.jsonl'] is a list"),
        ("algorithm.adv_kwargs={epsilon: .nan}", "algorithm.adv_kwargs.epsilon=nan is not a number"),
        ("guard.guards=[{name: grad_spike, params: {factor: .nan}}]", "guard.guards[0].params.factor=nan"),
    ],
)
def test_non_finite_numbers_and_malformed_lists_are_refused_before_start(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert expected in str(e.value)


def test_good_lists_and_bounds_pass():
    cfg = load_config(
        None, ["actor.betas=[0,0.95]", "trainer.seed=0", "trainer.total_epochs=1", "algorithm.adv_kwargs={cap: .inf}"]
    )
    assert cfg.actor.betas == [0, 0.95] and cfg.trainer.seed == 0 and cfg.algorithm.adv_kwargs == {"cap": float("inf")}


@pytest.mark.parametrize(
    "override, match",
    [
        (
            ["algorithm.adv_kwargs={epsilom: 1.0e-5}"],
            r"algorithm.adv_kwargs: unknown parameter 'epsilom' .*Did you mean 'epsilon'",
        ),
        (
            ["actor.policy_loss_kwargs={clip_ratio_hihg: 0.3}"],
            r"actor.policy_loss_kwargs: unknown parameter 'clip_ratio_hihg'",
        ),
        (["algorithm.adv_estimator=gae", "algorithm.adv_kwargs={normalize_components: true}"], r"has no groups"),
    ],
)
def test_estimator_and_loss_kwargs_are_checked_before_start(override, match):
    from armor_core.config.plugin_checks import validate_plugins

    with pytest.raises(ConfigError, match=match):
        validate_plugins(load_config(None, override))


def test_estimator_and_loss_kwargs_they_declare_pass():
    from armor_core.config.plugin_checks import validate_plugins

    validate_plugins(load_config(None, ["algorithm.adv_kwargs={normalize_components: true}"]))


def test_normalize_components_with_a_grouped_estimator_that_cannot_take_it_fails_at_start():
    import types

    from armor_core import AdvantageEstimator, hookimpl
    from armor_core.config.plugin_checks import validate_plugins
    from armor_core.testing import registered

    def mean_baseline(token_level_rewards, response_mask, index):
        adv = token_level_rewards - token_level_rewards.mean()
        return adv * response_mask, adv * response_mask

    plugin = types.SimpleNamespace(
        armor_register_advantage_estimators=hookimpl(
            lambda register: register("mean_baseline", AdvantageEstimator(fn=mean_baseline, grouped=True))
        )
    )
    overrides = ["algorithm.adv_estimator=mean_baseline", "algorithm.adv_kwargs={normalize_components: true}"]
    with (
        registered(plugin),
        pytest.raises(ConfigError, match=r"unknown parameter 'normalize_components' for mean_baseline"),
    ):
        validate_plugins(load_config(None, overrides))


def test_a_bare_guard_name_is_that_guard_with_its_defaults():
    from armor_core.stability.guard import GuardRunner

    cfg = load_config(None, ["guard.guards=[non_finite, {name: trust_region, params: {target_kl: 0.02}}]"])
    assert cfg.guard.guards == [
        {"name": "non_finite", "params": {}},
        {"name": "trust_region", "params": {"target_kl": 0.02}},
    ]
    runner = GuardRunner(cfg.guard.guards)
    assert runner.observe("grad", {"grad_norm": float("nan")}, 1).action == "skip"  # non_finite, built and watching
    with pytest.raises(ConfigError, match=r"guard.guards\[0\]=3: each guard is a name \(non_finite\) or \{name"):
        load_config(None, ["guard.guards=[3]"])
    with pytest.raises(ConfigError, match=r"guard.guards\[0\]=''"):
        load_config(None, ["guard.guards=['']"])
