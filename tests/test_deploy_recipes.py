"""Container, Kubernetes and HPC recipes in deploy/: the files parse, every
``dkernel`` command inside them is one the CLI accepts, every ``dask``
option is one the ``dask`` CLI knows, and the dask-jobqueue recipe renders a
job script with dkernel's worker settings (the image's install script and
entry point roles: test_deploy_image.py).  Building the image and
running the compose stack needs a Docker engine; without one that test skips
and says so."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dask
import pytest

yaml = pytest.importorskip("yaml", reason="the manifests are read with PyYAML")

from dkernel.cli import build_parser  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"


def _load(name: str) -> list[dict]:
    with open(DEPLOY / name) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _check_dkernel(argv: list[str]) -> None:
    """argparse accepts ``dkernel ARGV`` (parsed, not run); it exits on an error."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"dkernel rejects {' '.join(argv)!r} (exit {exc.code})")
    assert callable(args.func)


def _dask_options(command: str) -> set[str]:
    if command == "worker":
        from distributed.cli.dask_worker import main
    else:
        from distributed.cli.dask_scheduler import main
    return {o for p in main.params
            for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}


def _check_dask(argv: list[str]) -> None:
    """``dask scheduler|worker ARGV``: every option is one the CLI defines
    (``dask worker`` ignores unknown options, so parsing alone would not tell)."""
    assert argv[0] in ("scheduler", "worker"), argv
    known = _dask_options(argv[0])
    unknown = [a for a in argv[1:] if a.startswith("--") and a.split("=")[0] not in known]
    assert not unknown, f"dask {argv[0]} has no option(s) {unknown}"


def _check_image_command(argv: list[str]) -> str:
    """A command given to the image (its entry point's roles); returns the role."""
    role = argv[0]
    if role == "job":
        _check_dkernel(argv[1:])
    elif role == "dkernel":
        _check_dkernel(argv[1:])
    elif role == "dask":
        _check_dask(argv[1:])
    elif role in ("dask-scheduler", "dask-worker"):
        _check_dask([role.removeprefix("dask-"), *argv[1:]])
    else:
        assert role in ("scheduler", "worker"), f"the image has no role {role!r}"
        _check_dask([role, *argv[1:]])
    return role


# ------------------------------------------------------------- docker compose

def test_compose_file_starts_scheduler_dashboard_workers_and_a_fit_from_one_image():
    (compose,) = _load("docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"scheduler", "worker", "job"}
    assert {s["image"] for s in services.values()} == {"dkernel:0.1.0"}
    assert all(s.get("init") is True for s in services.values())  # signals, zombies
    assert services["scheduler"]["build"]["dockerfile"] == "deploy/Dockerfile"
    # the dashboard, on this machine only (the stack has no TLS)
    assert "127.0.0.1:8787:8787" in services["scheduler"]["ports"]
    job_argv = services["job"]["command"]  # a rerun replaces the model, resuming if cut short
    assert "--overwrite" in job_argv and "--resume" in job_argv
    # the build context is the repository root: its .venv and deploy/data stay out of it
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {".venv", "deploy/data"} <= set(ignored)
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["worker"]["environment"]["DASK_SCHEDULER_ADDRESS"] == "tcp://scheduler:8786"
    roles = {name: _check_image_command(s["command"]) for name, s in services.items()}
    assert roles == {"scheduler": "scheduler", "worker": "worker", "job": "job"}
    job = services["job"]["command"]
    assert job[1] == "fit" and job[job.index("--scheduler") + 1] == "tcp://scheduler:8786"
    assert job[2].startswith("/data/") and all(v.endswith(":/data") for v in
                                               services["job"]["volumes"])


def test_dockerfile_installs_dkernel_with_its_declared_dependencies_at_pinned_versions():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "deploy/install.sh" in text and 'ENTRYPOINT ["dkernel-entrypoint"]' in text
    # which packages: pyproject.toml's dkernel[deploy]; the constraints only pin versions
    assert '"$src[deploy]"' in (DEPLOY / "install.sh").read_text()
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            assert "[" not in name, f"pip refuses extras in a constraints file: {line}"
            pins[name] = version
    for package in ("dask", "distributed", "numpy", "zarr", "scikit-learn", "threadpoolctl"):
        assert package in pins, f"{package} is not pinned"
    # the image's dask and distributed match each other (they are released together)
    assert pins["dask"] == pins["distributed"]


def _docker_engine() -> str | None:
    """Why docker cannot be used here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        return f"'docker info' failed: {lines[-1] if lines else info.returncode}"
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        return "no 'docker compose' plugin"
    return None


def test_image_builds_and_compose_stack_runs_a_fit(tmp_path):
    why = _docker_engine()
    if why is not None:
        pytest.skip(f"needs a Docker engine: {why}")
    root = DEPLOY.parent
    compose = ["docker", "compose", "-f", str(DEPLOY / "docker-compose.yml"), "-p",
               f"dkernel-test-{os.getpid()}"]
    data = DEPLOY / "data"
    data.mkdir(exist_ok=True)
    os.chmod(data, 0o777)  # the image runs as uid 1000
    try:
        build = subprocess.run(["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t",
                                "dkernel:0.1.0", str(root)], capture_output=True, text=True,
                               timeout=1800)
        assert build.returncode == 0, build.stderr[-2000:]
        demo = subprocess.run([*compose, "run", "--rm", "--no-deps", "job", "demo", "--out",
                               "/data/demo", "--rows", "4000", "--features", "256", "--epochs",
                               "1", "--workers", "1"], capture_output=True, text=True,
                              timeout=900)
        assert demo.returncode == 0, demo.stderr[-2000:]
        up = subprocess.run([*compose, "up", "--abort-on-container-exit", "--exit-code-from",
                             "job"], capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout[-2000:]
        assert (data / "model.npz").exists()
    finally:
        subprocess.run([*compose, "down", "-v"], capture_output=True, timeout=300)
        shutil.rmtree(data, ignore_errors=True)


# ----------------------------------------------------------------- kubernetes

def _containers(pod_spec: dict) -> list[dict]:
    return pod_spec["containers"]


def test_daskcluster_manifest_runs_single_threaded_workers_of_the_image():
    (cluster,) = _load("kubernetes/daskcluster.yaml")
    assert cluster["apiVersion"] == "kubernetes.dask.org/v1" and cluster["kind"] == "DaskCluster"
    (worker,) = _containers(cluster["spec"]["worker"]["spec"])
    (scheduler,) = _containers(cluster["spec"]["scheduler"]["spec"])
    for c in (worker, scheduler):
        assert c["image"] == "dkernel:0.1.0"
        _check_image_command(c["args"])
    args = worker["args"]
    assert args[:2] == ["dask", "worker"] and args[args.index("--nthreads") + 1] == "1"
    assert "--memory-limit" in args and "--local-directory" in args
    assert cluster["spec"]["scheduler"]["service"]["ports"][0]["port"] == 8786


def test_daskjob_manifest_runs_dkernel_fit_with_checkpoints_on_its_own_cluster():
    (job,) = _load("kubernetes/daskjob.yaml")
    assert job["apiVersion"] == "kubernetes.dask.org/v1" and job["kind"] == "DaskJob"
    (runner,) = _containers(job["spec"]["job"]["spec"])
    argv = runner["args"]
    assert argv[:2] == ["dkernel", "fit"]
    _check_dkernel(argv[1:])
    # the operator sets DASK_SCHEDULER_ADDRESS in the job pod: no --scheduler needed
    assert "--scheduler" not in argv and "--resume" in argv
    for part in ("worker", "scheduler"):
        for c in _containers(job["spec"]["cluster"]["spec"][part]["spec"]):
            _check_image_command(c["args"])


def test_helm_values_and_fit_job_use_the_image_and_a_valid_fit():
    (values,) = _load("kubernetes/helm-values.yaml")
    for part in ("scheduler", "worker"):
        assert values[part]["image"]["repository"] == "dkernel"
    assert values["worker"]["threads_per_worker"] == 1
    assert values["worker"]["image"]["dask_worker"] == "dask-worker"  # mapped by the entry point
    _check_dask(["worker", *values["worker"]["extraArgs"]])
    assert values["jupyter"]["enabled"] is False
    (job,) = _load("kubernetes/helm-fit-job.yaml")
    (c,) = _containers(job["spec"]["template"]["spec"])
    assert _check_image_command(c["args"]) == "job"
    assert c["args"][c["args"].index("--scheduler") + 1] == "tcp://dkernel-scheduler:8786"


def test_entrypoint_maps_the_helm_charts_old_command_names():
    text = ENTRYPOINT.read_text()
    assert "dask-scheduler | dask-worker)" in text
    proc = subprocess.run(["bash", str(ENTRYPOINT), "dask-worker", "--help"], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep
                               + os.environ.get("PATH", "")})
    assert proc.returncode == 0 and "--nthreads" in proc.stdout, proc.stderr


# ------------------------------------------------------------------------ HPC

def _jobqueue_recipe():
    pytest.importorskip("dask_jobqueue", reason="the HPC recipe uses dask-jobqueue")
    spec = importlib.util.spec_from_file_location("fit_on_hpc", DEPLOY / "jobqueue" /
                                                  "fit_on_hpc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("system, directive", [("slurm", "#SBATCH"), ("pbs", "#PBS")])
def test_jobqueue_job_script_has_dkernels_worker_settings(system, directive, tmp_path):
    recipe = _jobqueue_recipe()
    with recipe.make_cluster(system, processes=4, memory="16GiB",
                             local_directory=str(tmp_path / "scratch"), queue="normal",
                             account="proj",
                             scheduler_options={"dashboard_address": ":0"}) as cluster:
        script = cluster.job_script()
    assert script.startswith("#!") and directive in script
    worker_line = next(line for line in script.splitlines() if "dask_worker" in line)
    assert "--nthreads 1" in worker_line and "--nworkers 4" in worker_line
    assert "--memory-limit 4.00GiB" in worker_line  # 16 GiB per job over 4 processes
    assert f"--local-directory {tmp_path / 'scratch'}" in worker_line
    # once: dask-jobqueue writes its own --death-timeout (60) unless told the value
    assert worker_line.count("--death-timeout") == 1 and "--death-timeout 120" in worker_line
    assert "normal" in script and "proj" in script
    # dkernel's glibc settings, as its own workers and the image have them
    assert "export MALLOC_TRIM_THRESHOLD_=67108864" in script


def test_jobqueue_recipe_keeps_the_malloc_settings_beside_a_users_own_prologue():
    """A site's prologue (a module load, a venv) is kept, and dkernel's glibc
    settings follow it (a prologue given used to replace them), unless it
    sets one of them itself."""
    recipe = _jobqueue_recipe()
    with recipe.make_cluster("slurm", scheduler_options={"dashboard_address": ":0"},
                             job_script_prologue=["module load python/3.11",
                                                  "export MALLOC_MMAP_THRESHOLD_=1048576"]
                             ) as cluster:
        script = cluster.job_script()
    lines = script.splitlines()
    assert lines.index("module load python/3.11") < lines.index(
        "export MALLOC_TRIM_THRESHOLD_=67108864")
    # the user's value wins, and is not followed by dkernel's
    assert "export MALLOC_MMAP_THRESHOLD_=1048576" in lines
    assert "export MALLOC_MMAP_THRESHOLD_=33554432" not in lines
    # a one-command assignment or a comment is not an export; a site's prologue in
    # the Dask config (read by dask-jobqueue only when none is passed) is kept too
    site = ["source /opt/venv/bin/activate", "MALLOC_TRIM_THRESHOLD_=1 python -c pass"]
    with dask.config.set({"jobqueue.slurm.job-script-prologue": site}), \
            recipe.make_cluster("slurm", scheduler_options={"dashboard_address": ":0"}) as cluster:
        lines = cluster.job_script().splitlines()
    assert "source /opt/venv/bin/activate" in lines
    assert "export MALLOC_TRIM_THRESHOLD_=67108864" in lines


def test_jobqueue_recipe_checks_the_store_before_submitting_jobs(tmp_path, capsys):
    recipe = _jobqueue_recipe()
    with pytest.raises(SystemExit):
        recipe.main([str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "m.npz")])
    assert "missing.zarr" in capsys.readouterr().err


def test_jobqueue_recipe_prints_its_job_script_without_a_batch_system(capsys):
    recipe = _jobqueue_recipe()
    assert recipe.main(["--system", "slurm", "--dashboard-address", ":0",
                        "--print-job-script"]) == 0
    assert "#SBATCH" in capsys.readouterr().out
