"""ARMOR against TRL's GRPOTrainer on the default job, side by side on this machine.

    python benchmarks/vs_trl.py --trl-python /work/trl-venv/bin/python [--steps 150] [--eval-every 25] [--target 0.65]
    [--seeds 1 2 3]

One invocation runs ``armor``'s trainer and TRL's ``GRPOTrainer`` one after the other, each in a
subprocess of its own (so peak memory is each one's own), on the same work: the built-in model
``builtin:arithmetic-tiny``, the built-in ``arithmetic`` task's train rows and 500 held-out rows
(same seed), 16 prompts x 8 samples per step, one on-policy update per batch (TRL:
``num_iterations=1``, ``steps_per_generation=1``), lr 5e-5 constant, AdamW (0.9, 0.999), no weight
decay, grad-norm clip 1.0, PPO clip 0.2, no KL (TRL ``beta=0``), temperature 1.0, no top-k/top-p,
at most 8 new tokens, group-std-normalised advantages, token-mean loss aggregation over the batch
(TRL ``loss_type="dapo"``, ARMOR ``token-mean``). TRL's reward function *is* ARMOR's ``arithmetic``
reward domain. Both see the same prompts at every step: TRL gets the train rows in the order
ARMOR's loader draws them, with its own shuffling off (``shuffle_dataset=False``). The
micro-batch is the whole batch on both (TRL ``per_device_train_batch_size=128``,
``gradient_accumulation_steps=1``; ARMOR ``actor.micro_batch_size=128``).

Both are evaluated by the same code: greedy decoding of the 500 held-out prompts with ARMOR's
``hf`` rollout and scoring by the ``arithmetic`` reward domain (what ``Trainer.validate`` does), every
``--eval-every`` steps; evaluation time is excluded from both clocks. Printed: median seconds per
step (after ``--warmup`` steps), tokens (prompt + response, real) per second, peak RSS of the whole
process tree (ARMOR: driver + Ray daemons + workers; TRL: its one process), held-out accuracy at
the end, and the training wall time to first reach ``--target`` accuracy.

TRL is not an ARMOR dependency. Install it apart, e.g. ``pip install 'armor-rl[bench]'`` or a
separate venv that sees this one's packages:

    python3.11 -m venv /work/trl-venv
    echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" >
    /work/trl-venv/lib/python3.11/site-packages/armor.pth
    /work/trl-venv/bin/pip install trl==1.16.0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SETTINGS = {
    "model": "builtin:arithmetic-tiny",
    "task": "arithmetic",
    "seed": 1,
    "train_size": 4096,
    "val_size": 500,
    "prompts_per_step": 16,
    "group_size": 8,
    "lr": 5e-5,
    "temperature": 1.0,
    "max_new_tokens": 8,
    "clip_eps": 0.2,
    "grad_clip": 1.0,
    "kl_beta": 0.0,
    "loss_aggregation": "token-mean (TRL loss_type=dapo)",
    "advantage": "GRPO, group std normalised (TRL scale_rewards=group)",
}


class PeakRSS:
    """Samples the RSS of this process and all its descendants; ``peak`` is the largest sum seen."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self.root, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in [self.root, *self.root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join()


def armor_config(steps: int, run_dir: str, val_freq: int = 0):
    from armor_core.config.schema import load_config

    s = SETTINGS
    return load_config(
        None,
        [
            f"model.path={s['model']}",
            f"data.task={s['task']}",
            f"trainer.seed={s['seed']}",
            f"data.train_size={s['train_size']}",
            f"data.val_size={s['val_size']}",
            f"data.train_batch_size={s['prompts_per_step']}",
            f"actor.ppo_mini_batch_size={s['prompts_per_step']}",
            f"rollout.n={s['group_size']}",
            f"actor.lr={s['lr']}",
            f"rollout.temperature={s['temperature']}",
            f"rollout.max_new_tokens={s['max_new_tokens']}",
            f"actor.clip_ratio_low={s['clip_eps']}",
            f"actor.clip_ratio_high={s['clip_eps']}",
            f"actor.grad_clip={s['grad_clip']}",
            "actor.use_kl_loss=false",
            "actor.loss_agg_mode=token-mean",
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std=true",
            "rollout.top_k=0",
            "rollout.top_p=1.0",
            "actor.lr_schedule=constant",
            "actor.warmup_steps=0",
            "actor.weight_decay=0.0",
            "actor.ppo_epochs=1",
            f"actor.micro_batch_size={s['prompts_per_step'] * s['group_size']}",
            f"trainer.total_steps={steps}",
            f"trainer.val_freq={val_freq}",
            f"trainer.run_dir={run_dir}",
            "trainer.loggers=[jsonl]",
        ],
    )


def greedy_accuracy(model, tokenizer, cfg, val_encoded, rewards) -> float:
    """What ``Trainer.validate`` computes, for a model in this process: greedy decoding of the
    held-out prompts with the ``hf`` rollout, scored by their reward domain; the share scoring 1."""
    import numpy as np

    from armor_core.dataproto.protocol import DataProto
    from armor_plugins.rollout.hf import HFRollout

    data = DataProto.from_dict(tensors=dict(val_encoded["tensors"]), non_tensors=dict(val_encoded["non_tensors"]))
    out = HFRollout(model, tokenizer, cfg.rollout).generate(
        data.select(tensor_keys=["input_ids", "attention_mask", "position_ids"]), greedy=True
    )
    mask = out["response_mask"].bool()
    texts = [tokenizer.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(out["responses"], mask)]
    nt = data.non_tensors
    extras = [{**(e or {}), "response_length": int(n)} for e, n in zip(nt["extra"], mask.sum(-1).tolist())]
    scores = np.asarray(
        rewards.score(list(nt["raw_prompt"]), texts, list(nt["data_source"]), list(nt["ground_truth"]), extras).scores
    )
    return float((scores >= 1.0 - 1e-6).mean())


# -- ARMOR ------------------------------------------------------------------------------------------


def run_armor(steps: int, eval_every: int) -> dict:
    from armor_core.loop.trainer import Trainer
    from armor_core.workers.api import ActorAPI

    with tempfile.TemporaryDirectory() as tmp, PeakRSS() as mem:
        # val_freq tells the trainer where the evaluations fall, so it does not queue a generation
        # before one (trainer.overlap_generation): that generation's time would leave the clock
        trainer = Trainer(armor_config(steps, str(Path(tmp) / "run"), val_freq=eval_every))
        try:
            evals = [(0, trainer.validate()["val/acc_greedy"], 0.0)]
            clock, step_s, tokens, breakdown = 0.0, [], [], []
            for step in range(1, steps + 1):
                t0 = time.perf_counter()
                m = trainer.train_step()
                trainer.log(m)  # metrics.jsonl, as TRL logs every step (logging_steps=1)
                dt = time.perf_counter() - t0
                clock += dt
                step_s.append(dt)
                tokens.append(m["perf/total_num_tokens"])
                breakdown.append({k: v for k, v in m.items() if k.startswith(("timing_s/", "perf/"))})
                if step % eval_every == 0 or step == steps:
                    evals.append((step, trainer.validate()["val/acc_greedy"], clock))
            threads = trainer.actor.call(ActorAPI.ping)[0]["threads"]
        finally:
            trainer.close()
    return {
        "step_s": step_s,
        "tokens": tokens,
        "evals": evals,
        "peak_rss": mem.peak,
        "threads": threads,
        "breakdown": breakdown,
    }


# -- TRL --------------------------------------------------------------------------------------------


def run_trl(steps: int, eval_every: int) -> dict:
    import torch
    from datasets import Dataset as HFDataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from armor_core.loop.data import prepare_data
    from armor_core.models.loading import load_model, load_tokenizer, resolve_model_path
    from armor_core.plugins import get_plugin_manager
    from armor_core.rewards.manager import RewardManager

    s = SETTINGS
    with tempfile.TemporaryDirectory() as tmp:
        cfg = armor_config(steps, str(Path(tmp) / "run"))
        pm = get_plugin_manager()
        path = resolve_model_path(s["model"])
        tokenizer = load_tokenizer(path)
        rewards = RewardManager(cfg.reward, pm)
        train, val = prepare_data(cfg, pm, tokenizer, rewards)
        domain = pm.get("reward_domain", "arithmetic")

        def arithmetic_reward(prompts, completions, ground_truth, **_):
            """ARMOR's ``arithmetic`` reward domain, as a TRL reward function."""
            out = []
            for p, c, gt in zip(prompts, completions, ground_truth):
                r = domain.fn(p, c, gt, {})
                out.append(float(getattr(r, "score", r)))
            return out

        # ARMOR's data order: the batches its loader draws, one after another
        from armor_core.loop.data import PromptLoader

        loader = PromptLoader(train.encoded, s["prompts_per_step"], shuffle=True, seed=s["seed"])
        ordered = []
        for _ in range(steps):
            nt = loader.next_batch().non_tensors
            ordered += [{"prompt": p, "ground_truth": gt} for p, gt in zip(nt["raw_prompt"], nt["ground_truth"])]
        rows = HFDataset.from_list(ordered)
        model = load_model(path, "float32")
        args = GRPOConfig(
            output_dir=str(Path(tmp) / "trl"),
            max_steps=steps,
            per_device_train_batch_size=s["prompts_per_step"] * s["group_size"],
            num_generations=s["group_size"],
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            learning_rate=s["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=s["grad_clip"],
            temperature=s["temperature"],
            top_p=1.0,
            top_k=0,
            max_completion_length=s["max_new_tokens"],
            beta=s["kl_beta"],
            epsilon=s["clip_eps"],
            loss_type="dapo",
            scale_rewards="group",
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            seed=s["seed"],
            data_seed=s["seed"],
            dataloader_num_workers=0,
            disable_tqdm=True,
            log_completions=False,
            remove_unused_columns=False,
            shuffle_dataset=False,
        )

        class Clock(TrainerCallback):
            """Training wall time with evaluation taken out; an evaluation every ``eval_every`` steps."""

            def __init__(self) -> None:
                self.evals, self.step_s, self.tokens, self.clock, self.last = [], [], [], 0.0, None

            def on_train_begin(self, args, state, control, model=None, **kw):
                self.evals.append((0, greedy_accuracy(model, tokenizer, cfg, val.encoded, rewards), 0.0))
                self.last = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "num_tokens" in logs:
                    self.tokens.append(logs["num_tokens"])

            def on_step_end(self, args, state, control, model=None, **kw):
                dt = time.perf_counter() - self.last
                self.clock += dt
                self.step_s.append(dt)
                if state.global_step % eval_every == 0 or state.global_step == steps:
                    self.evals.append(
                        (state.global_step, greedy_accuracy(model, tokenizer, cfg, val.encoded, rewards), self.clock)
                    )
                self.last = time.perf_counter()

        parts: dict[str, list[float]] = {"gen": [], "gen_and_score": []}

        class TimedGRPO(GRPOTrainer):
            """GRPOTrainer, timing its generation (and generation + reward + advantages) per step."""

            def _generate(self, prompts):
                t0 = time.perf_counter()
                out = super()._generate(prompts)
                parts["gen"].append(time.perf_counter() - t0)
                return out

            def _generate_and_score_completions(self, inputs):
                t0 = time.perf_counter()
                out = super()._generate_and_score_completions(inputs)
                parts["gen_and_score"].append(time.perf_counter() - t0)
                return out

        clock = Clock()
        with PeakRSS() as mem:
            trainer = TimedGRPO(
                model=model,
                reward_funcs=arithmetic_reward,
                args=args,
                train_dataset=rows,
                processing_class=tokenizer,
                callbacks=[clock],
            )
            trainer.train()
        rewards.close()
    # num_tokens is cumulative (prompt + completion tokens seen); per step: its differences.
    # Logging happens after on_step_end, so the step's own log is the one after it.
    cum = clock.tokens
    tokens = [b - a for a, b in zip([0.0, *cum[:-1]], cum)][: len(clock.step_s)]
    breakdown = [
        {"timing_s/gen": g, "timing_s/score_and_adv": gs - g, "timing_s/update_and_rest": st - gs}
        for g, gs, st in zip(parts["gen"], parts["gen_and_score"], clock.step_s)
    ]
    return {
        "step_s": clock.step_s,
        "tokens": tokens,
        "evals": clock.evals,
        "peak_rss": mem.peak,
        "threads": torch.get_num_threads(),
        "breakdown": breakdown,
    }


# -- the table ---------------------------------------------------------------------------------------


def summarise(r: dict, warmup: int, target: float) -> dict:
    import numpy as np

    steps = np.array(r["step_s"][warmup:])
    toks = np.array(r["tokens"][warmup : len(r["step_s"])])
    reached = next(((step, clock) for step, acc, clock in r["evals"] if acc >= target), None)
    # the first crossing of a noisy curve moves by whole evaluation intervals with the sampling's
    # luck; the first evaluation at which the mean of the last three reaches the target moves less
    ev = r["evals"]
    smooth = next(
        ((ev[i][0], ev[i][2]) for i in range(2, len(ev)) if sum(e[1] for e in ev[i - 2 : i + 1]) / 3 >= target), None
    )
    return {
        "s_per_step": float(np.median(steps)),
        "tokens_per_s": float(toks.sum() / steps[: len(toks)].sum()) if len(toks) else float("nan"),
        "peak_rss_mb": r["peak_rss"] / 2**20,
        "acc_start": r["evals"][0][1],
        "acc_end": r["evals"][-1][1],
        "steps": r["evals"][-1][0],
        "to_target_s": reached[1] if reached else None,
        "to_target_step": reached[0] if reached else None,
        "to_target_smooth_s": smooth[1] if smooth else None,
        "to_target_smooth_step": smooth[0] if smooth else None,
        "train_s": sum(r["step_s"]),
        "threads": r["threads"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the per-step medians")
    ap.add_argument("--target", type=float, default=0.65, help="held-out greedy accuracy to reach")
    ap.add_argument("--trl-python", default=sys.executable, help="interpreter with trl installed")
    ap.add_argument("--side", choices=["armor", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1],
        help="one pair of runs per seed (data order, sampling, the TRL/ARMOR seed)",
    )
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        SETTINGS["seed"] = a.seed
        result = (run_armor if a.side == "armor" else run_trl)(a.steps, a.eval_every)
        Path(a.out).write_text(json.dumps(result))
        return
    runs = []
    for seed in a.seeds:
        SETTINGS["seed"] = seed
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            for side, python in (("armor", sys.executable), ("trl", a.trl_python)):
                out = Path(tmp) / f"{side}.json"
                print(f"seed {seed}: running {side} ({python}) ...", flush=True)
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [
                        python,
                        __file__,
                        "--side",
                        side,
                        "--out",
                        str(out),
                        "--steps",
                        str(a.steps),
                        "--eval-every",
                        str(a.eval_every),
                        "--seed",
                        str(seed),
                    ],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    sys.exit(f"{side} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
                results[side] = json.loads(out.read_text())
                print(f"  {side} done in {time.perf_counter() - t0:.0f} s", flush=True)
        print_table(results, a)
        runs.append({"seed": seed, "results": results})
    if len(runs) > 1:
        print_over_seeds(runs, a)
    if a.json:
        Path(a.json).write_text(json.dumps({"settings": SETTINGS, "args": vars(a), "runs": runs}))


def print_over_seeds(runs: list[dict], a) -> None:
    """Medians over seeds: a single run's time to target moves by a whole evaluation interval with
    the luck of the sampling, in both trainers, so one seed's ratio is a noisy number."""
    import numpy as np

    print(f"\nover {len(runs)} seeds ({', '.join(str(r['seed']) for r in runs)}):")
    print(
        f"{'seed':>6} {'s/step ARMOR':>13} {'s/step TRL':>11} {'to target ARMOR':>16} {'to target TRL':>14} "
        f"{'ratio':>7} {'mean-of-3 ratio':>16} {'final acc ARMOR':>16} {'final acc TRL':>14}"
    )
    ratios, smooth_ratios, step_ratios, finals = [], [], [], []
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in runs:
        arm, trl = (summarise(r["results"][k], a.warmup, a.target) for k in ("armor", "trl"))
        ratio = trl["to_target_s"] / arm["to_target_s"] if arm["to_target_s"] and trl["to_target_s"] else None
        smooth = (
            trl["to_target_smooth_s"] / arm["to_target_smooth_s"]
            if arm["to_target_smooth_s"] and trl["to_target_smooth_s"]
            else None
        )
        ratios.append(ratio)
        smooth_ratios.append(smooth)
        step_ratios.append(trl["s_per_step"] / arm["s_per_step"])
        finals.append(arm["acc_end"] - trl["acc_end"])
        print(
            f"{r['seed']:>6} {arm['s_per_step']:13.3f} {trl['s_per_step']:11.3f} {fmt(arm['to_target_s'], '16.1f')} "
            f"{fmt(trl['to_target_s'], '14.1f')} {fmt(ratio, '6.2f')}x {fmt(smooth, '15.2f')}x "
            f"{arm['acc_end']:16.3f} {trl['acc_end']:14.3f}"
        )
    med = lambda xs: (
        f"{np.median([x for x in xs if x is not None]):.2f}x ({sum(x is not None for x in xs)} of {len(xs)} seeds "
        "reached it on both)"
        if any(x is not None for x in xs)
        else "-"
    )  # noqa: E731
    print(
        f"median over seeds: seconds per step {np.median(step_ratios):.2f}x faster; train seconds to accuracy >= "
        f"{a.target}: first evaluation {med(ratios)}, mean of 3 evaluations {med(smooth_ratios)}; final accuracy "
        f"ARMOR - TRL {np.median(finals):+.3f}"
    )


def print_table(results: dict, a) -> None:
    import numpy as np

    arm, trl = (summarise(results[k], a.warmup, a.target) for k in ("armor", "trl"))
    print("\nsettings: " + ", ".join(f"{k}={v}" for k, v in SETTINGS.items()))
    print(
        f"steps={a.steps}, eval every {a.eval_every} steps on {SETTINGS['val_size']} held-out problems (greedy), "
        f"median over steps after {a.warmup} warm-up steps, target accuracy {a.target}, torch threads "
        f"armor={arm['threads']} trl={trl['threads']}"
    )
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    rows = [
        ("seconds per step (median)", "s_per_step", ".3f", "trl/armor"),
        ("tokens per second", "tokens_per_s", ".0f", "armor/trl"),
        ("peak RSS, MB (process tree)", "peak_rss_mb", ".0f", "trl/armor"),
        ("held-out accuracy at step 0", "acc_start", ".3f", None),
        (f"held-out accuracy at step {arm['steps']}", "acc_end", ".3f", "armor-trl"),
        (f"train seconds to accuracy >= {a.target}", "to_target_s", ".1f", "trl/armor"),
        ("  (at step)", "to_target_step", "d", None),
        ("  same, mean of 3 evaluations", "to_target_smooth_s", ".1f", "trl/armor"),
        ("  (at step)", "to_target_smooth_step", "d", None),
        ("train seconds, all steps", "train_s", ".1f", "trl/armor"),
    ]
    print(f"\n{'':38} {'ARMOR':>10} {'TRL':>10} {'ratio':>12}")
    for label, key, f, how in rows:
        x, y = arm[key], trl[key]
        ratio = "-"
        if how and x is not None and y is not None:
            ratio = {
                "trl/armor": lambda: f"{y / x:.2f}x",
                "armor/trl": lambda: f"{x / y:.2f}x",
                "armor-trl": lambda: f"{x - y:+.3f}",
            }[how]()
        print(f"{label:38} {fmt(x, f):>10} {fmt(y, f):>10} {ratio:>12}")
    print(
        "\naccuracy curve (step: armor / trl): "
        + ", ".join(
            f"{sa}: {aa:.3f} / {at:.3f}"
            for (sa, aa, _), (_, at, _) in zip(results["armor"]["evals"], results["trl"]["evals"])
        )
    )
    for side in ("armor", "trl"):
        b = results[side].get("breakdown") or []
        keys = sorted({k for m in b for k in m if k.startswith("timing_s/")})
        med = {k: float(np.median([m.get(k, 0.0) for m in b[a.warmup :]])) for k in keys}
        print(
            f"{side.upper()} step breakdown (median s): "
            + ", ".join(f"{k.split('/')[1]} {v:.4f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1]))
        )
    b = results["armor"]["breakdown"][a.warmup :]
    for k in ("perf/engine_overhead_frac", "perf/padding_waste"):
        print(f"ARMOR {k} (median): {np.median([m[k] for m in b if k in m]):.3f}")


if __name__ == "__main__":
    main()
