"""The launch recipes of docs/scaling.md (docs/launch/): each parses, and every `armor run` and `ray` command line
in them parses with ARMOR's own argument parser and config loader and with Ray's command line.

The Slurm script runs here under bash with stand-ins for the commands a cluster provides (srun, scontrol, ray,
armor, and the python that waits for the nodes), each of which records its arguments: what is checked is what the
script would run. No Ray cluster and no training starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import yaml

from armor_core.cli.main import build_parser
from armor_core.cli.run import split_config_and_overrides
from armor_core.config.schema import ArmorConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "docs" / "launch"


def _documents() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all((LAUNCH / "rayjob.yaml").read_text())}


def _armor_config(argv: list[str], config_file: Path) -> ArmorConfig:
    """``armor run`` argv parsed as `armor` parses it, its config file replaced by ``config_file``, then loaded and
    its plugins resolved as `armor run` does before anything starts."""
    assert argv[:2] == ["armor", "run"], argv
    args, extra = build_parser().parse_known_args(argv[1:])
    assert all("=" in a and not a.startswith("-") for a in extra), extra
    assert args.config and not args.config.count("="), args.config  # the config file comes first
    config, overrides = split_config_and_overrides(str(config_file), [*args.overrides, *extra])
    cfg = load_config(config, overrides)
    if cfg.rollout.backend != "vllm" or importlib.util.find_spec("vllm") is not None:
        from armor_core.config.plugin_checks import validate_plugins

        validate_plugins(cfg)
    return cfg


def _example_config(tmp_path: Path) -> Path:
    """The run config the RayJob manifest ships in its ConfigMap, as a file."""
    path = tmp_path / "run.yaml"
    path.write_text(_documents()["ConfigMap"]["data"]["run.yaml"])
    return path


def _mounts(group: dict) -> dict[str, str]:
    """A RayJob pod group's mount paths, each with the volume it mounts (a ConfigMap's or a claim's name)."""
    pod = group["template"]["spec"]
    sources = {v["name"]: (v.get("persistentVolumeClaim") or v.get("configMap") or {}) for v in pod["volumes"]}
    return {
        m["mountPath"]: sources[m["name"]].get("claimName") or sources[m["name"]].get("name")
        for c in pod["containers"]
        for m in c["volumeMounts"]
    }


def test_the_rayjob_manifest_runs_armor_run_with_auto_resume(tmp_path):
    docs = _documents()
    job, cluster = docs["RayJob"], docs["RayJob"]["spec"]["rayClusterSpec"]
    assert job["apiVersion"] == "ray.io/v1" and job["spec"]["backoffLimit"] > 0  # a failed run is retried
    argv = shlex.split(job["spec"]["entrypoint"])
    cfg = _armor_config(argv, _example_config(tmp_path))
    assert cfg.trainer.resume == "auto" and cfg.engine.address == "auto" and cfg.trainer.save_freq > 0
    # the driver runs on the head: the config file is the ConfigMap, mounted there
    assert _mounts(cluster["headGroupSpec"])[str(Path(argv[2]).parent)] == docs["ConfigMap"]["metadata"]["name"]
    # every pod mounts the one shared run directory (the workers write checkpoint shards into it)
    runs = "/" + Path(cfg.trainer.run_dir).parts[1]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert _mounts(group)[runs] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    gpus = sum(
        int(g["replicas"]) * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        for g in cluster["workerGroupSpecs"]
    )
    assert cfg.actor.num_workers * cfg.engine.gpus_per_worker == gpus  # one actor rank per GPU of the worker pods


def test_the_documented_ray_job_submit_command_parses(tmp_path):
    from ray.dashboard.modules.job.cli import submit

    text = (ROOT / "docs" / "scaling.md").read_text()
    found = re.search(r"^ray job submit .*?[^\\]$", text, re.S | re.M)
    assert found, "docs/scaling.md has no `ray job submit` command"
    argv = shlex.split(found.group(0).replace("\\\n", " "))
    assert argv[:3] == ["ray", "job", "submit"]
    params = submit.make_context("submit", argv[3:]).params  # Ray's own option parser
    assert params["address"].endswith(":8265") and params["working_dir"] == "."
    cfg = _armor_config(list(params["entrypoint"]), _example_config(tmp_path))
    assert cfg.trainer.resume == "auto" and cfg.engine.address == "auto"


STAND_IN = """#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
stdin = sys.stdin.read() if name == "python" else ""
with open(os.environ["CALLS"], "a") as fh:
    fh.write(json.dumps({"cmd": name, "argv": sys.argv[1:], "stdin": stdin}) + "\\n")
if name == "scontrol":
    print("gpu-001\\ngpu-002\\ngpu-003")
elif name == "srun" and "hostname" in sys.argv:
    print("10.1.2.3 fe80::1")
elif name == "python":
    print(os.environ["SLURM_JOB_NUM_NODES"])
elif name == "armor":
    sys.exit(7)
"""


def _run_sbatch(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "ray", "armor", "python", "sleep"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls.jsonl"),
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "armor",
        "SLURM_JOB_NODELIST": "gpu-[001-003]",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_CPUS_PER_TASK": "64",
    }
    out = subprocess.run(
        ["bash", str(LAUNCH / "slurm.sbatch"), *args], env=env, capture_output=True, text=True, timeout=60
    )
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return out, calls


def test_the_slurm_script_starts_ray_on_every_node_then_armor_run_with_auto_resume(tmp_path):
    from ray.scripts.scripts import start

    script = (LAUNCH / "slurm.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(LAUNCH / "slurm.sbatch")], capture_output=True).returncode == 0
    header = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"--nodes=2", "--requeue", "--open-mode=append", "--signal=B:USR1@300"} <= set(header)
    assert script.startswith("#!/bin/bash\n")

    config = _example_config(tmp_path)
    out, calls = _run_sbatch(tmp_path, str(config), "actor.lr=2e-6")
    assert out.returncode == 7, out.stderr  # armor run's exit code is the job's

    # the sruns run in the background: their records come in any order
    starts = {
        c["argv"][c["argv"].index("-w") + 1]: start.make_context(
            "start", c["argv"][c["argv"].index("ray") + 2 :]
        ).params
        for c in calls
        if c["cmd"] == "srun" and "ray" in c["argv"]
    }  # host -> `ray start` options, read by Ray's own option parser
    head = starts.pop("gpu-001")  # the head on the first node, a worker on each other
    assert head["head"] and head["node_ip_address"] == "10.1.2.3" and sorted(starts) == ["gpu-002", "gpu-003"]
    assert all(not p["head"] and p["address"] == f"10.1.2.3:{head['port']}" for p in starts.values())
    assert all(p["block"] and p["num_gpus"] == 8 and p["num_cpus"] == 64 for p in [head, *starts.values()])
    head_address = f"10.1.2.3:{head['port']}"

    waits = [c for c in calls if c["cmd"] == "python"]
    assert waits and waits[0]["argv"] == ["-", head_address]
    compile(waits[0]["stdin"], "slurm.sbatch (node wait)", "exec")  # the Python the script would run

    (armor,) = [c for c in calls if c["cmd"] == "armor"]
    cfg = _armor_config(["armor", *armor["argv"]], config)
    assert cfg.trainer.resume == "auto" and cfg.trainer.save_freq > 0
    assert cfg.engine.address == head_address
    assert cfg.actor.num_workers == 24 and cfg.engine.gpus_per_worker == 1  # 3 nodes x 8 GPUs, one rank each
    assert cfg.trainer.run_dir == str(tmp_path / "armor-runs" / "armor")  # no job id: a requeue finds its run
    assert cfg.actor.lr == 2e-6  # the job's own overrides come last


def test_the_slurm_script_asks_for_its_config():
    out = subprocess.run(["bash", str(LAUNCH / "slurm.sbatch")], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "usage: sbatch slurm.sbatch CONFIG" in out.stderr
