"""benchmarks/gpu_check.py, as far as a CPU can take it: arguments, the model's size, the runs'
config, the summary and table, the refusal without a GPU, and the whole check on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_loader import load_benchmark

gpu_check = load_benchmark("gpu_check")


def test_the_preset_has_qwen2_5_0_5b_shapes_with_an_untied_head():
    v, h, layers, kv, inter = 151_936, 896, 24, 2 * 64, 4864
    attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q (with bias), k and v (with bias, 2 heads of 64), o
    per_layer = attention + 3 * h * inter + 2 * h
    assert gpu_check.count_parameters("0.5b") == v * h + layers * per_layer + h + v * h


def test_defaults_and_bad_arguments():
    args = gpu_check.parse_args([])
    assert (args.preset, args.backends, args.device, args.dtype, args.steps) == (
        "0.5b",
        ["hf", "vllm"],
        "cuda",
        "bfloat16",
        20,
    )
    for argv in (
        ["--steps", "0"],
        ["--warmup", "5", "--steps", "5"],
        ["--backends", "sglang"],
        ["--dtype", "float16"],
        ["notakeyvalue"],
    ):
        with pytest.raises(SystemExit) as e:
            gpu_check.parse_args(argv)
        assert e.value.code == 2


def test_every_run_config_is_one_armor_accepts(tmp_path):
    from armor_core.config.schema import load_config

    args = gpu_check.parse_args(["--max-new-tokens", "128", "--sleep-level", "2", "actor.logprob_chunk_tokens=512"])
    for backend in ("hf", "vllm"):
        cfg = load_config(None, gpu_check.overrides(args, backend, tmp_path / "model", tmp_path / backend))
        assert (cfg.model.dtype, cfg.trainer.device, cfg.rollout.backend, cfg.engine.gpus_per_worker) == (
            "bfloat16",
            "cuda",
            backend,
            1.0,
        )
        assert (cfg.trainer.total_steps, cfg.rollout.max_new_tokens, cfg.actor.logprob_chunk_tokens) == (20, 128, 512)
        assert cfg.actor.skip_zero_advantage is False and cfg.actor.max_tokens_per_micro_batch == 16384
        assert cfg.rollout.backend_kwargs == ({"sleep_level": 2} if backend == "vllm" else {})


def test_summary_takes_medians_after_warmup_and_the_table_shows_them():
    rows = [
        {"timing_s/step": 100.0, "perf/throughput": 1.0, "timing_s/gen": 50.0, "response_length/mean": 10.0}
    ]  # warm-up
    for i in range(3):
        rows.append(
            {
                "timing_s/step": 2.0 + i,
                "perf/throughput": 1000.0 * (i + 1),
                "timing_s/gen": 1.0,
                "response_length/mean": 100.0,
                "timing_s/update_weights": 0.5,
                "perf/max_memory_allocated_gb": 10.0 + i,
                "perf/gpu_memory_used_gb": 20.0,
                "rollout/logprob_diff_mean": 1e-3 * (i + 1),
                "rollout/logprob_diff_max": 0.1 * (i + 1),
            }
        )
    rows.append({"actor/pg_loss": 0.0})  # a row without a step (validation) is not a step
    s = gpu_check.summarize(rows, warmup=1, weight_gb=2.0, rows_per_step=128)
    assert s["steps"] == 3 and s["step_s"] == 3.0 and s["tokens_per_s"] == 2000.0 and s["gen_tokens_per_s"] == 12800.0
    assert (
        s["sync_s_per_gb"] == 0.25
        and s["peak_allocated_gb"] == 12.0
        and s["logprob_diff_mean"] == 2e-3
        and s["logprob_diff_max"] == pytest.approx(0.3)
    )
    table = gpu_check.format_table({"vllm": s, "hf": {"error": "RuntimeError: boom"}})
    lines = table.splitlines()
    assert lines[0].startswith("| backend") and "sync s/GB" in lines[0]
    assert "12,800" in lines[2] and "2.00e-03" in lines[2] and "RuntimeError: boom" in lines[3]
    with pytest.raises(ValueError, match="no measured steps"):
        gpu_check.summarize(rows[:1], warmup=1, weight_gb=1.0, rows_per_step=1)


def test_without_a_gpu_it_says_so_and_how_to_run_the_cpu_smoke_run(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--preset tiny --device cpu" in err


@pytest.mark.slow
def test_the_whole_check_runs_on_a_tiny_model_sharded_and_resumes_on_another_rank_count(ray_cluster, tmp_path, capsys):
    code = gpu_check.main(
        [
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--backends",
            "hf",
            "--batch",
            "2",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--ranks",
            "2",
            "--resume-ranks",
            "1",
            "--keep",
            str(tmp_path),
            "engine.cpus_per_worker=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert (
        f"model: tiny ({gpu_check.count_parameters('tiny') / 1e9:.3f}B parameters" in out
    )  # the 151,936-token vocabulary
    header = [c.strip() for c in out.splitlines()[-3].split("|")]
    hf = dict(zip(header, (c.strip() for c in out.splitlines()[-1].split("|"))))
    assert hf["backend"] == "hf" and float(hf["tokens/s"].replace(",", "")) > 0
    # trainer and rollout agree on the sampled tokens' log-probs (float32), sampled with top-p 0.9 and top-k 20 from a
    # near-uniform 151,936-token distribution: only over the kept sets replayed (0.02% of the mass kept)
    assert float(hf["dlogp mean abs"]) < 1e-3 and 0 < float(hf["kept mass"]) < 0.01
    assert (Path(tmp_path) / "run-hf" / "metrics.jsonl").exists()
    # FSDP2 on 2 ranks wrote its checkpoint sharded, each rank its part; resumed on 1 rank, two more steps ran
    shards = list((Path(tmp_path) / "run-hf" / "checkpoints" / "step_000002" / "actor_shards").glob("*.distcp"))
    assert len(shards) == 2 and hf["ranks"] == "2" and hf["resumed"].startswith("2->1: pg_loss"), out
