"""``armor report``: every plot holds what metrics.jsonl holds, runs overlay, guard actions are marked
and tabled, unfinished and truncated runs are read, and the HTML page needs nothing outside itself.

Run directories are written the way a run writes them: rows through the ``jsonl`` tracker (the
metric names a default ``armor run`` logs), events through ``GuardRunner``, a validation as a row
of its own.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import math
import random
import re
from pathlib import Path

import pytest

from armor_core import Verdict, hookimpl
from armor_core.cli.main import main as cli_main
from armor_core.report import PAGE, SIDECAR, ReportError, write_report
from armor_core.stability.guard import GuardRunner
from armor_core.testing import registered
from armor_plugins.trackers import JsonlTracker

REPO = Path(__file__).resolve().parents[3]
TRAIN_KEYS = [
    "critic/score/mean",
    "reward/source/arithmetic/score",
    "reward/arithmetic/score",
    "reward/arithmetic/correct",
    "reward/arithmetic/well_formed",
    "reward/arithmetic/failures",
    "reward/failures",
    "actor/ppo_kl",
    "actor/ppo_kl_k3",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/grad_norm",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "actor/lr",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "actor/pg_loss",
]
ALL_PLOTS = {
    "heldout_accuracy",
    "train_score",
    "train_score_arithmetic",
    "kl",
    "entropy",
    "clip_fraction",
    "grad_norm",
    "response_length",
    "response_clipped",
    "learning_rate",
    "step_time",
    "logprob_diff",
}


class Scripted:
    """A guard plugin that gives the verdicts in ``SCRIPT[(stage, step)]``."""

    SCRIPT: dict[tuple[str, int], Verdict] = {}

    @hookimpl
    def armor_register_stability_guards(self, register):
        script = self.SCRIPT

        class ScriptedGuard:
            def observe(self, stage, stats, step):
                return script.get((stage, step))

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass

        register("scripted", ScriptedGuard)


def make_run(
    path: Path,
    steps: int = 12,
    seed: int = 0,
    nan_grad_at: tuple[int, ...] = (),
    events: dict | None = None,
    keys: list[str] = TRAIN_KEYS,
    finished: bool = True,
    ranks: int = 1,
) -> Path:
    rng = random.Random(seed)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"actor": {"grad_clip": 1.0}}))
    tracker = JsonlTracker(path)
    tracker.log(
        {"val/acc_greedy": 0.5, "val/arithmetic/acc_greedy": 0.5, "val/arithmetic/score_greedy": 0.5, "val/step": 0.0},
        0,
    )
    for step in range(1, steps + 1):
        row = {k: rng.uniform(0.1, 4.0) for k in keys}
        row.update(
            {"reward/arithmetic/score": row["reward/arithmetic/correct"]} if "reward/arithmetic/correct" in row else {}
        )
        row.update({"actor/grad_norm": math.nan} if step in nan_grad_at and "actor/grad_norm" in keys else {})
        tracker.log(row, step)
        if step % 5 == 0:
            tracker.log(
                {"val/acc_greedy": rng.random(), "val/arithmetic/acc_greedy": rng.random(), "val/step": float(step)},
                step,
            )
    tracker.close()
    Scripted.SCRIPT = events or {}
    with registered(Scripted(), load_entrypoints=False) as pm:
        for _ in range(ranks):  # every actor rank writes the worker-side events
            runner = GuardRunner([{"name": "scripted"}], pm=pm, run_dir=path)
            for stage, step in sorted(Scripted.SCRIPT, key=lambda k: k[1]):
                runner.observe(stage, {}, step)
    if finished:
        (path / "summary.json").write_text("{}")
    return path


def logged(path: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as the test reads it: complete lines, later rows of a step winning."""
    out: dict[str, dict[int, float]] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        for k, v in row.items():
            if k != "step":
                out.setdefault(k, {})[row["step"]] = float(v)
    return out


def series_of(plot: dict, run: str) -> dict[str, dict]:
    return {s["key"]: s for s in plot["series"] if s["run"] == run}


def assert_drawn_equals_logged(plot: dict, run: str, data: dict[str, dict[int, float]]) -> None:
    for key, s in series_of(plot, run).items():
        expected = (
            data[key]
            if key != "actor/grad_norm_after_clip"
            else {k: min(v, 1.0) for k, v in data["actor/grad_norm"].items()}
        )
        finite = {k: v for k, v in sorted(expected.items()) if math.isfinite(v)}
        assert s["steps"] == list(finite), (plot["file"], key)
        assert s["values"] == pytest.approx(list(finite.values())), (plot["file"], key)
        assert s["nonfinite_steps"] == [k for k, v in sorted(expected.items()) if not math.isfinite(v)], (
            plot["file"],
            key,
        )


def assert_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.load()
        assert img.format == "PNG" and img.width > 400 and img.height > 200
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20)) > 20  # axes, text and curves, not a blank canvas


def test_every_plot_holds_what_metrics_jsonl_holds(tmp_path):
    run = make_run(tmp_path / "run", nan_grad_at=(3,))
    report = write_report([run])
    out = run / "report"
    assert set(report["plots"]) == ALL_PLOTS and report["not_drawn"] == []
    assert json.loads((out / SIDECAR).read_text()) == json.loads(json.dumps(report))
    data = logged(run)
    for name, plot in report["plots"].items():
        assert_png(out / f"{name}.png")
        assert_drawn_equals_logged(plot, "run", data)

    def keys(name: str) -> list[str]:
        return [s["key"] for s in report["plots"][name]["series"]]

    assert keys("heldout_accuracy") == ["val/acc_greedy", "val/arithmetic/acc_greedy"]  # accuracy, not score_greedy
    assert keys("train_score_arithmetic") == [
        "reward/arithmetic/correct",
        "reward/arithmetic/score",
        "reward/arithmetic/well_formed",
    ]
    assert report["plots"]["train_score_arithmetic"]["same_as"] == {
        "reward/arithmetic/score": "reward/arithmetic/correct"
    }  # said in the legend
    assert report["plots"]["heldout_accuracy"]["same_as"] == {}  # equal at step 0 only
    assert keys("grad_norm") == ["actor/grad_norm", "actor/grad_norm_after_clip"]
    assert keys("step_time")[0] == "timing_s/step" and set(keys("step_time")) == {
        "timing_s/step",
        "timing_s/gen",
        "timing_s/update_actor",
    }
    assert report["plots"]["grad_norm"]["series"][0]["nonfinite_steps"] == [3]
    assert report["plots"]["heldout_accuracy"]["series"][0]["steps"] == [
        0,
        5,
        10,
    ]  # the validation rows, merged by step


def test_guard_actions_are_marked_on_every_curve_and_tabled(tmp_path):
    script = {
        ("grad", 3): Verdict("skip", "grad_norm is nan", math.nan, None),
        ("grad", 5): Verdict("scale", "grad spike", 9.0, 3.0, scale=0.25),
        ("update", 7): Verdict("adjust", "entropy low", 0.1, 0.2, adjustments={"lr": 1e-5}),
        ("update", 9): Verdict("rollback", "update too large", 0.01, 0.002, since=8),
    }
    run = make_run(tmp_path / "run", events=script, ranks=2)
    report = write_report([run])
    assert [(e["step"], e["action"]) for e in report["events"]] == [
        (3, "skip"),
        (5, "scale"),
        (7, "adjust"),
        (9, "rollback"),
    ]  # once, not per rank
    for name, plot in report["plots"].items():
        assert sorted((e["step"], e["action"]) for e in plot["events"]) == [
            (3, "skip"),
            (5, "scale"),
            (7, "adjust"),
            (9, "rollback"),
        ], name
        for key, s in series_of(plot, "run").items():
            points = dict(zip(s["steps"], s["values"]))
            marks = {(m["step"], m["action"]): m["value"] for m in plot["marks"] if m["key"] == key}
            expected = {
                (st, a): points[st]
                for st, a in [(3, "skip"), (5, "scale"), (7, "adjust"), (9, "rollback")]
                if st in points
            }
            assert marks == pytest.approx(expected), (name, key)
    page = (run / "report" / PAGE).read_text()
    table = page[page.index('id="guard-events"') :]
    for reason in ("grad_norm is nan", "grad spike", "entropy low", "update too large"):
        assert table.count(reason) == 1
    assert "gradients x0.25" in table and "back to before step 8" in table and "lr = 1e-05" in table


def test_two_runs_overlay_on_the_same_axes(tmp_path):
    off = make_run(tmp_path / "off", seed=1)
    on = make_run(tmp_path / "on", seed=2, events={("grad", 4): Verdict("skip", "nan")})
    assert (
        cli_main(
            ["report", str(off), str(on), "--out", str(tmp_path / "cmp"), "--label", "guard off", "--label", "guard on"]
        )
        == 0
    )
    report = json.loads((tmp_path / "cmp" / SIDECAR).read_text())
    assert [r["label"] for r in report["runs"]] == ["guard off", "guard on"]
    for name, plot in report["plots"].items():
        assert {s["run"] for s in plot["series"]} == {"guard off", "guard on"}, name
        assert_drawn_equals_logged(plot, "guard off", logged(off))
        assert_drawn_equals_logged(plot, "guard on", logged(on))
        assert [(e["run"], e["step"]) for e in plot["events"]] == [("guard on", 4)]
        styles = {s["run"]: s["linestyle"] for s in plot["series"]}
        assert styles["guard off"] != styles["guard on"]
    assert not (off / "report").exists()


def test_a_crashed_run_with_a_truncated_last_line(tmp_path):
    run = make_run(tmp_path / "run", steps=6, finished=False)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 7, "actor/entropy": 0.5, "actor/grad_no')  # killed mid-write
    report = write_report([run])
    entropy = series_of(report["plots"]["entropy"], "run")["actor/entropy"]
    assert entropy["steps"] == [1, 2, 3, 4, 5, 6]
    assert_drawn_equals_logged(report["plots"]["entropy"], "run", logged(run))
    notes = report["runs"][0]["notes"]
    assert any("last line is incomplete" in n for n in notes) and any("no summary.json" in n for n in notes)
    assert report["runs"][0]["last_step"] == 6 and report["runs"][0]["finished"] is False
    assert "last line is incomplete" in (run / "report" / PAGE).read_text()


def test_the_page_embeds_every_image_and_reaches_nothing_outside(tmp_path):
    run = make_run(tmp_path / "run", events={("grad", 2): Verdict("skip", "x")})
    write_report([run])
    out = run / "report"
    page = (out / PAGE).read_text()
    embedded = [
        base64.b64decode(src) for src in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    ]
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == len(ALL_PLOTS) and sorted(embedded) == sorted(p.read_bytes() for p in pngs)
    assert len(re.findall(r"<img ", page)) == len(pngs)
    text = re.sub(r"(data:image/png;base64,)[A-Za-z0-9+/=]+", r"\1", page)  # base64 has '/' in its alphabet
    for outside in ("http:", "https:", "//", "<script", "<link", "url(", "@import", "<iframe", 'src="/', "href="):
        assert outside not in text, outside
    assert re.findall(r'src="([^"]*)"', text) == ["data:image/png;base64,"] * len(pngs)


def test_plots_without_metrics_are_not_drawn_and_old_ones_go(tmp_path):
    full = make_run(tmp_path / "full")
    out = tmp_path / "out"
    write_report([full], out)
    (out / "mine.png").write_bytes(b"not the report's")
    assert (out / "logprob_diff.png").exists()
    partial = make_run(tmp_path / "partial", keys=["critic/score/mean", "actor/entropy"])
    report = write_report([partial], out)
    assert set(report["plots"]) == {"heldout_accuracy", "train_score", "entropy"}
    assert "Rollout vs trainer log-prob difference" in report["not_drawn"] and "Gradient norm" in report["not_drawn"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "entropy.png",
        "heldout_accuracy.png",
        "mine.png",
        "train_score.png",
    ]


def test_errors_name_what_is_wrong(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="has no metrics.jsonl"):
        write_report([tmp_path / "empty"])
    run = make_run(tmp_path / "run")
    with pytest.raises(ReportError, match="2 --label values for 1 run directories"):
        write_report([run], labels=["a", "b"])


def test_the_stability_benchmark_writes_its_guard_off_on_overlay(tmp_path):
    spec = importlib.util.spec_from_file_location("stability_bench", REPO / "benchmarks" / "stability.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    make_run(tmp_path / "clean-off", seed=1)
    make_run(tmp_path / "clean-on", seed=2, events={("grad", 3): Verdict("skip", "nan")})
    [page] = bench.write_overlays(tmp_path, ["clean"])
    assert page == tmp_path / "report" / "clean" / PAGE and page.exists()
    report = json.loads((page.parent / SIDECAR).read_text())
    assert {s["run"] for s in report["plots"]["entropy"]["series"]} == {"guard off", "guard on"}
    assert [(e["run"], e["step"], e["action"]) for e in report["events"]] == [("guard on", 3, "skip")]
    assert io.BytesIO((page.parent / "entropy.png").read_bytes()).read(4) == b"\x89PNG"


def test_a_reward_models_gap_to_its_rule_is_plotted_where_logged(tmp_path):
    run = make_run(tmp_path / "rm", keys=["critic/score/mean", "reward/model_minus_rule"])
    report = write_report([run])
    assert "model_minus_rule" in report["plots"] and "Reward model minus rule" not in report["not_drawn"]
    assert_drawn_equals_logged(report["plots"]["model_minus_rule"], "rm", logged(run))
    plain = write_report([make_run(tmp_path / "plain", keys=["critic/score/mean"])])
    assert "model_minus_rule" not in plain["plots"] and "Reward model minus rule" not in plain["not_drawn"]
