"""Config loading: defaults, YAML, overrides, and errors that name the key, the value and what is allowed."""

from __future__ import annotations

import dataclasses

import pytest

from armor_core.config import ArmorConfig, ConfigError, help_for, load_config, to_yaml


def test_defaults_yaml_and_overrides_merge_in_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  lr: 1.0e-5\nrollout:\n  n: 4\n")
    cfg = load_config(path, ["rollout.n=16"])
    assert cfg.actor.lr == 1e-5          # from YAML
    assert cfg.rollout.n == 16           # override beats YAML
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
    from armor_core.config import validate_plugins
    from armor_core.testing import registered

    class NeedsEngine:
        @hookimpl
        def armor_register_rollout_backends(self, register):
            class Fancy:
                @classmethod
                def check_available(cls):
                    raise ImportError("fancy-engine is not installed: pip install fancy-engine")

            register("fancy", Fancy)

    with registered(NeedsEngine()), pytest.raises(ConfigError, match=r"rollout.backend='fancy': fancy-engine is not installed: pip install fancy-engine"):
        validate_plugins(load_config(None, ["rollout.backend=fancy"]))


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.filter_groups=true", "rollout.n=1"], r"rollout.n=1 samples per prompt always agree"),
    (["algorithm.filter_groups=true", "algorithm.adv_estimator=reinforce_plus_plus"], r"adv_estimator='reinforce_plus_plus' does not compare .* \(dr_grpo, grpo, opo, pass_at_k"),
    (["algorithm.filter_groups=true", "algorithm.adv_estimator=gae"], r"adv_estimator='gae' does not compare"),
    (["algorithm.max_gen_batches=0"], r"algorithm.max_gen_batches=0 is out of range"),
    (["algorithm.rollout_correction=tis"], r"algorithm.rollout_correction='tis' is out of range: must be one of"),
    (["algorithm.rollout_correction_cap=0"], r"algorithm.rollout_correction_cap=0.0 is out of range"),
])
def test_dynamic_sampling_and_rollout_correction_settings_are_checked(overrides, match):
    from armor_core.config import validate_plugins

    with pytest.raises(ConfigError, match=match):
        validate_plugins(load_config(None, overrides))


def test_grouped_estimators_pass_with_filter_groups():
    from armor_core.config import validate_plugins

    for name in ("grpo", "dr_grpo", "rloo", "opo", "reinforce_plus_plus_baseline"):
        validate_plugins(load_config(None, ["algorithm.filter_groups=true", f"algorithm.adv_estimator={name}"]))
