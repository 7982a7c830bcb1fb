"""ProcessIsolator: planning, exclusivity, applying an assignment in a real child process, GPU health."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sys
import types

import pytest

from armor_core.engine import gpu_health, isolation
from armor_core.engine.gpu_health import device_health, parse_nvidia_smi
from armor_core.engine.isolation import (
    Assignment,
    IsolationError,
    ProcessIsolator,
    apply_assignment,
    check_exclusive,
    check_health,
    detect_available_cpus,
    detect_visible_gpus,
    format_assignment,
    plan_assignment,
    write_assignment,
)

# -- planning -----------------------------------------------------------------------------------


def test_two_workers_one_core_each_on_two_cores():
    plan = plan_assignment({"actor": 2}, 1, 0, [0, 1], None)
    assert plan == [Assignment("actor", 0, (0,), ()), Assignment("actor", 1, (1,), ())]


def test_groups_in_order_consecutive_sorted_cores():
    plan = plan_assignment({"actor": 2, "critic": 1}, 2.0, 0, [4, 5, 0, 1, 2, 3, 7, 1], None, node="n1")
    assert [(a.group, a.rank, a.cpus, a.node) for a in plan] == [
        ("actor", 0, (0, 1), "n1"),
        ("actor", 1, (2, 3), "n1"),
        ("critic", 0, (4, 5), "n1"),
    ]


def test_short_of_cores_says_what_was_asked_and_what_exists():
    with pytest.raises(IsolationError) as e:
        plan_assignment({"actor": 2, "critic": 1}, 1, 0, [0, 1], None)
    msg = str(e.value)
    assert (
        "3 workers (actor: 2, critic: 1)" in msg
        and "3 cores" in msg
        and "may use 2: [0, 1]" in msg
        and "engine.cpus_per_worker" in msg
    )


def test_gpus_come_from_the_users_mask():
    visible = detect_visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"})
    assert visible == ["2", "3"]
    plan = plan_assignment({"actor": 2}, 1, 1, [0, 1], visible)
    assert [a.gpus for a in plan] == [("2",), ("3",)]
    with pytest.raises(IsolationError, match=r"3 GPUs, but 2 are visible: \['2', '3'\]"):
        plan_assignment({"actor": 3}, 0, 1, [0], visible)


def test_visible_devices_parsing():
    assert detect_visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert detect_visible_gpus({"CUDA_VISIBLE_DEVICES": "0, 1,-1,2"}) == ["0", "1"]  # CUDA stops at an invalid entry
    assert detect_visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f3a,MIG-1c2d"}) == ["GPU-8f3a", "MIG-1c2d"]
    assert detect_available_cpus() == sorted(os.sched_getaffinity(0))


def test_whole_devices_only_and_zero_means_unassigned():
    with pytest.raises(IsolationError, match="engine.cpus_per_worker"):
        plan_assignment({"actor": 1}, 0.5, 0, [0, 1], None)
    with pytest.raises(IsolationError, match="engine.gpus_per_worker"):
        plan_assignment({"actor": 1}, 1, 0.5, [0, 1], ["0"])
    assert plan_assignment({"actor": 3}, 0, 0, [0], None) == [Assignment("actor", r, (), ()) for r in range(3)]


def test_exclusivity_error_names_both_workers():
    with pytest.raises(IsolationError, match="actor rank 1 and critic rank 0 both claim CPU core 1"):
        check_exclusive(
            [Assignment("actor", 0, (0,), ()), Assignment("actor", 1, (1,), ()), Assignment("critic", 0, (1,), ())]
        )
    with pytest.raises(IsolationError, match="actor rank 0 and ref rank 0 both claim GPU 3"):
        check_exclusive([Assignment("actor", 0, (0,), ("3",)), Assignment("ref", 0, (1,), ("3",))])
    with pytest.raises(IsolationError, match="actor rank 0 is planned twice"):
        check_exclusive([Assignment("actor", 0, (0,), ()), Assignment("actor", 0, (1,), ())])
    # the same core number on two nodes is two different cores
    check_exclusive([Assignment("actor", 0, (0,), ("0",), "a"), Assignment("actor", 1, (0,), ("0",), "b")])
    check_exclusive(plan_assignment({"actor": 2, "critic": 2}, 2, 0, range(8), None))


# -- applying it in a real worker process -------------------------------------------------------


def _child(scenarios):
    """Runs in a spawned process: apply each assignment and read back what holds, independently."""
    import torch

    out = []
    for a, seed, mask in scenarios:
        if mask != "inherit":
            if mask is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = mask
        try:
            record = apply_assignment(a, seed)
        except IsolationError as e:
            out.append(
                {
                    "error": str(e),
                    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "affinity": sorted(os.sched_getaffinity(0)),
                }
            )
            continue
        out.append(
            {
                "record": record,
                "affinity": sorted(os.sched_getaffinity(0)),
                "threads": torch.get_num_threads(),
                "omp": os.environ.get("OMP_NUM_THREADS"),
                "mkl": os.environ.get("MKL_NUM_THREADS"),
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "pyrand": random.random(),
                "torchrand": torch.rand(1).item(),
            }
        )
    return out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is a Linux API")
def test_apply_assignment_in_a_spawned_worker(monkeypatch):
    import torch

    cores = detect_available_cpus()
    last = cores[-1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the user's mask, inherited by the worker
    parent_affinity = os.sched_getaffinity(0)
    scenarios = [
        (Assignment("actor", 1, (last,), ("3",)), 5, "inherit"),
        (Assignment("actor", 0, (cores[0],), ("5",)), 5, "2,3"),  # outside the mask: would widen it
        (Assignment("actor", 0, (last,), ("0",)), 5, None),  # no mask: nothing to widen
        (Assignment("critic", 0, (), ()), 5, "2,3"),  # no GPU: the mask is emptied, not kept
    ]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        first, widened, unmasked, cpu_only = pool.apply(_child, (scenarios,))
    assert first["affinity"] == [last] and first["threads"] == 1 and first["omp"] == "1" and first["mkl"] == "1"
    assert first["cuda"] == "3"
    assert first["pyrand"] == random.Random(6).random()  # seed 5 + rank 1
    assert first["torchrand"] == torch.rand(1, generator=torch.Generator().manual_seed(6)).item()
    rec = first["record"]
    assert (rec["group"], rec["rank"], rec["cpus"], rec["gpus"], rec["threads"], rec["seed"]) == (
        "actor",
        1,
        [last],
        ["3"],
        1,
        6,
    )
    assert rec["pid"] != os.getpid() and rec["cuda_visible_devices"] == "3"
    assert "['5']" in widened["error"] and "never widens" in widened["error"]
    assert widened["cuda"] == "2,3" and widened["affinity"] == [last]  # refused before anything changed
    assert unmasked["cuda"] == "0"
    assert cpu_only["cuda"] == "" and cpu_only["record"]["seed"] == 5
    assert os.sched_getaffinity(0) == parent_affinity  # the test process itself was not touched


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is a Linux API")
def test_apply_assignment_refuses_a_core_outside_the_mask():
    a = Assignment("actor", 0, (max(detect_available_cpus()) + 4096,), ())
    with pytest.raises(IsolationError, match="actor rank 0: cannot pin to cores"):
        apply_assignment(a, 0, hide_gpus_when_none=False)


# -- GPU health ---------------------------------------------------------------------------------

SMI = "0, GPU-aaaa-1111, NVIDIA H200, 140000, 143771, 35, 0\n1, GPU-bbbb-2222, NVIDIA H200, 500, 143771, 95, [N/A]\n"


def test_device_health_is_empty_without_nvml_or_nvidia_smi(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setattr(gpu_health.shutil, "which", lambda name: None)
    assert device_health() == []


def test_parse_nvidia_smi():
    rows = parse_nvidia_smi(SMI)
    assert rows[0] == {
        "index": 0,
        "uuid": "GPU-aaaa-1111",
        "name": "NVIDIA H200",
        "memory_free_mib": 140000.0,
        "memory_total_mib": 143771.0,
        "temperature_c": 35.0,
        "ecc_uncorrected": 0,
        "source": "nvidia-smi",
    }
    assert rows[1]["ecc_uncorrected"] is None and rows[1]["memory_free_mib"] == 500.0


def test_device_health_through_nvml(monkeypatch):
    class NVMLError(Exception):
        pass

    def no_ecc(*_):
        raise NVMLError("Not Supported")

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=3 * 2**30, total=8 * 2**30),
        nvmlDeviceGetUUID=lambda h: b"GPU-cccc",
        nvmlDeviceGetName=lambda h: "Tiny GPU",
        nvmlDeviceGetTemperature=lambda h, s: 41,
        nvmlDeviceGetTotalEccErrors=no_ecc,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert device_health() == [
        {
            "index": 0,
            "uuid": "GPU-cccc",
            "name": "Tiny GPU",
            "memory_free_mib": 3072.0,
            "memory_total_mib": 8192.0,
            "temperature_c": 41,
            "ecc_uncorrected": None,
            "source": "nvml",
        }
    ]


def test_check_health_refuses_unhealthy_devices():
    health = parse_nvidia_smi(SMI)
    good, bad = Assignment("actor", 0, (), ("0",)), Assignment("actor", 1, (), ("1",))
    check_health([good], health)
    with pytest.raises(IsolationError) as e:
        check_health([good, bad], health, min_free_mib=1024, max_temperature_c=90)
    msg = str(e.value)
    assert (
        "actor rank 1: GPU 1 (NVIDIA H200, GPU-bbbb-2222) has 500 MiB free" in msg
        and "95 C, limit 90 C" in msg
        and "rank 0" not in msg
    )
    check_health([bad], health, min_free_mib=None, max_temperature_c=None)
    with pytest.raises(IsolationError, match="GPU-bbbb"):  # a UUID in the mask, abbreviated as nvidia-smi allows
        check_health([Assignment("ref", 0, (), ("GPU-bbbb",))], health)
    ecc = [dict(health[0], ecc_uncorrected=2)]
    with pytest.raises(IsolationError, match="2 uncorrected ECC errors"):
        check_health([good], ecc)


def test_isolator_plans_checks_health_and_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(isolation, "device_health", lambda: parse_nvidia_smi(SMI))
    iso = ProcessIsolator(cpus_per_worker=1, gpus_per_worker=1, seed=3)
    with pytest.raises(IsolationError, match="GPU 1"):
        iso.plan({"actor": 2}, available_cpus=[0, 1], visible_gpus=["0", "1"])
    plan = ProcessIsolator(cpus_per_worker=1, gpus_per_worker=0).plan({"actor": 2}, available_cpus=[0, 1])
    assert [a.cpus for a in plan] == [(0,), (1,)]
    records = [
        {
            "pid": 11,
            "hostname": "h",
            "node": "",
            "group": "actor",
            "rank": r,
            "cpus": [r],
            "gpus": [],
            "cuda_visible_devices": "",
            "threads": 1,
            "seed": 3 + r,
        }
        for r in (1, 0)
    ]
    path = iso.report(records, tmp_path)
    assert path == tmp_path / "isolation.json"
    saved = json.loads(path.read_text())
    assert [w["rank"] for w in saved["workers"]] == [0, 1] and saved["devices"][1]["uuid"] == "GPU-bbbb-2222"
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["worker", "pid", "host", "cpus", "gpus", "threads", "seed"]
    assert out[1].split() == ["actor", "0", "11", "h", "0", "-", "1", "3"]
    assert format_assignment(records) == "\n".join(out)
    assert write_assignment(tmp_path / "new", records).exists()
