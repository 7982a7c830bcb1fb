"""``armor run [CONFIG] [key=value ...]``: validate the config, assemble the plugins it names, check the
model files and the run directory (``preflight``), train."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="train a policy with RL (no arguments: the built-in recipe on CPU)",
        description="Train with the config in CONFIG (YAML), overridden by key=value pairs "
        "(e.g. actor.lr=1e-5 rollout.n=16). "
        "Without CONFIG, the built-in recipe runs: a tiny Qwen2 model learns two-number addition with GRPO on CPU. "
        "Every key, its default and its help: `armor run --help-config`.",
    )
    p.add_argument(
        "config",
        nargs="?",
        help="YAML config file, or recipe:NAME for a recipe shipped with ARMOR, e.g. recipe:cross_domain (optional)",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.total_steps=50")
    p.add_argument("--print-config", action="store_true", help="print the merged config and exit")
    p.add_argument(
        "--help-config", action="store_true", help="print every config key with its default and help, and exit"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest intact checkpoint in trainer.run_dir, with the config it was started with "
        "(trainer.resume=auto does this whenever the run directory holds one, and starts at step 0 otherwise). "
        "A checkpoint from an older ARMOR whose worker states are torch .pt files is read only with "
        "trainer.allow_legacy_pt_state=true (torch.load with weights_only=True; nothing is unpickled otherwise)",
    )
    p.add_argument(
        "--allow-config-change",
        dest="allow_config_change",
        action="append",
        default=[],
        metavar="KEY,...",
        help="with --resume or trainer.resume=auto: keys (or sections, e.g. actor) allowed to differ from the run's "
        "config.json. The run's length, checkpoint and validation schedule, loggers, faults, allow_legacy_pt_state, "
        "trainer.resume and engine.* may always change",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate the config, data and plugins, print the plan, and exit"
    )
    p.set_defaults(func=main)


def split_config_and_overrides(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    # argparse puts a first key=value into `config` when no YAML is given
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        return None, [config, *overrides]
    return config, list(overrides)


def _check_resume(args: argparse.Namespace, cfg) -> None:
    """``--resume`` continues with the config the run was started with, but for the changes allowed; so does
    ``trainer.resume=auto`` when the run directory holds an intact checkpoint (without one the run starts at step 0)."""
    from armor_core.config.schema import ConfigError, to_dict
    from armor_core.loop.resume import has_checkpoint, resumed_by
    from armor_core.storage.run_dir import check_resume_config

    allowed = [key for item in args.allow_config_change for key in item.split(",")]
    by = resumed_by(cfg, args.resume)
    if by is None:
        if allowed:
            raise ConfigError("--allow-config-change applies to --resume (or trainer.resume=auto) only")
        return
    if not args.resume and not has_checkpoint(cfg):
        return
    for line in check_resume_config(cfg.trainer.run_dir, to_dict(cfg), allowed, by):
        print(f"{by}: config changed as allowed: {line}")


def main(args: argparse.Namespace) -> int:
    """A user error propagates to ``cli.main``, which prints it as one line (exit code 2)."""
    from armor_core.config.schema import help_for, load_config
    from armor_core.loop.preflight import check_run

    if args.help_config:
        for key, help_text, default in help_for():
            print(f"{key} = {default!r}\n    {help_text}")
        return 0
    config_path, overrides = split_config_and_overrides(args.config, args.overrides)
    cfg = load_config(config_path, overrides)
    if args.print_config or args.dry_run:
        return _check_only(args, cfg)
    check_run(cfg)  # model files, tokenizer, guard parameters: before any worker starts
    from armor_core.loop.trainer import run_training
    from armor_core.storage.run_dir import RunDirLock

    with RunDirLock(cfg.trainer.run_dir):  # held until the run ends: a second run into the directory stops here
        _check_resume(args, cfg)
        run_training(cfg, resume=args.resume)  # the trainer validates the plugins and the run directory
    return 0


def _check_only(args: argparse.Namespace, cfg) -> int:
    """``--print-config`` and ``--dry-run``: what the trainer would check first, without starting it."""
    from armor_core.config.plugin_checks import validate_plugins
    from armor_core.config.schema import to_yaml
    from armor_core.loop.preflight import check_run
    from armor_core.loop.resume import resumed_by
    from armor_core.storage.run_dir import check_new_run

    plan = validate_plugins(cfg)
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    check_run(cfg)
    _check_resume(args, cfg)
    if resumed_by(cfg, args.resume) is None:
        check_new_run(cfg.trainer.run_dir)
    print_plan(plan)
    from armor_core.loop.data import prepare_data

    prepare_data(cfg)
    return 0


def print_plan(plan: dict) -> None:
    """``--dry-run``'s list of what the run would use: each config key and its implementation (a function kind's
    function, a class kind's class)."""
    print("config and plugins are valid; this run would use:")
    for key, impl in plan.items():
        shown = getattr(impl, "fn", impl)
        print(f"  {key}: {getattr(shown, '__name__', type(shown).__name__)}")
