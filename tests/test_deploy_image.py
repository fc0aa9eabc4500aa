"""The image of ``deploy/Dockerfile`` runs dkernel as ``deploy/README.md``
shows it.

No image registry is reachable here, so the build starts from a Debian root
made with debootstrap and is built with buildah (``--isolation chroot``: this
VM lacks CAP_SYS_RESOURCE, so podman's OCI runtime cannot start a container,
``crun: setrlimit RLIMIT_NPROC: Operation not permitted``, but a chroot
build and run work).  Where buildah or debootstrap is missing that test
skips and says so; the image's own install script (``deploy/install.sh``)
then still runs in a fresh virtual environment, with nothing from the test
environment on its path, and every role of the entry point runs from it.
The Kubernetes manifests are checked against Kubernetes' API schemas offline
(``kubernetes-validate``), and the dask operator's resources against its own
CRD schemas (tests/data/dask_operator_crds)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster import stop_process_groups

from dkernel.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
SMALL_DEMO = ["--rows", "2000", "--features", "128", "--epochs", "1", "--workers", "1"]


def _dkernel_commands() -> set[str]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_entrypoint_runs_every_dkernel_command_given_as_the_role():
    # "docker compose run job demo ..." replaces the service's command, so the
    # entry point sees "demo" as its role: it ran "exec demo" (rc 127)
    line = next(x for x in ENTRYPOINT.read_text().splitlines()
                if re.match(r"\s*ingest \|.*\)$", x))
    roles = {r.strip() for r in line.strip().rstrip(")").split("|")}
    assert roles == _dkernel_commands()


# ------------------------------------------------- install script, fresh venv

@pytest.fixture(scope="module")
def image_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a container of the image: deploy/install.sh's
    virtual environment first on PATH, nothing of this test's Python."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    proc = subprocess.run(["sh", str(DEPLOY / "install.sh"), str(ROOT), str(venv)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("dkernel 0.1.0")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DASK_"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return env


def _role(env: dict[str, str], *argv: str, timeout: float = 300,
          cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ENTRYPOINT), *argv], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_install_script_gives_an_environment_where_the_demo_runs(image_env, tmp_path):
    # as deploy/README.md: "docker compose ... run --rm --no-deps job demo --out /data/demo"
    proc = _role(image_env, "demo", "--out", str(tmp_path / "demo"), *SMALL_DEMO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "demo" / "model.npz").exists()
    info = _role(image_env, "job", "info", str(tmp_path / "demo" / "model.npz"))
    assert info.returncode == 0 and "DSGClassifier" in info.stdout, info.stderr


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    stop_process_groups(procs)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler_role, worker_role", [("scheduler", "worker"),
                                                         ("dask-scheduler", "dask-worker")])
def test_install_script_gives_every_role_of_the_entrypoint(image_env, tmp_path, processes,
                                                          scheduler_role, worker_role):
    """What the compose services and the Helm chart's pods run, as processes."""
    store = tmp_path / "train.zarr"
    made = _role(image_env, "make-store", str(store), "--rows", "600", "--inputs", "3",
                 "--chunk-rows", "200", "--task", "classification", "--quiet")
    assert made.returncode == 0, made.stderr
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**image_env, "DASK_SCHEDULER_PORT": str(port), "DASK_DASHBOARD_PORT": "0",
           "DASK_SCHEDULER_ADDRESS": address, "DKERNEL_WORKERS": "1",
           "DKERNEL_MEMORY_LIMIT": "1GiB", "DKERNEL_LOCAL_DIRECTORY": str(tmp_path / "space")}
    if scheduler_role == "scheduler":
        roles = [["scheduler"], ["worker"]]
    else:  # the chart's command lines: it passes the address and options itself
        roles = [["dask-scheduler", "--port", str(port), "--dashboard-address", ":0"],
                 ["dask-worker", address, "--nthreads", "1", "--memory-limit", "1GiB"]]
    for argv in roles:
        processes.append(subprocess.Popen(["bash", str(ENTRYPOINT), *argv], env=env,
                                          start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    model = tmp_path / "model.npz"
    fit = _role(env, "job", "fit", str(store), "--features", "64", "--block-size", "32",
                "--epochs", "1", "--batch-size", "64", "--scheduler", address, "--quiet",
                "--out", str(model), timeout=240)
    assert fit.returncode == 0, fit.stderr
    # a dkernel command as the role itself, and "anything else" run as given
    evaluate = _role(env, "evaluate", str(model), str(store), "--json")
    assert evaluate.returncode == 0 and '"accuracy"' in evaluate.stdout, evaluate.stderr
    other = _role(env, "python", "-c", "import sklearn, threadpoolctl, pyarrow, s3fs, bokeh")
    assert other.returncode == 0, other.stderr


# ------------------------------------------------------- the image, built here

def _no_image_build() -> str | None:
    """Why the image cannot be built here, or None when it can."""
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    if missing:
        return (f"no {' or '.join(missing)} on PATH (Debian: apt-get install buildah "
                "debootstrap)")
    if os.geteuid() != 0:
        return "debootstrap and a chroot build need root"
    return None


def _run(*argv: str, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(argv[:3])}: {proc.stderr[-3000:]}"
    return proc


BASE = "localhost/dkernel-base:bookworm"


def _debian_base(tmp_path: Path) -> str:
    """A base image with python3 from Debian packages (the Dockerfile's BASE),
    made once: the registries' python:3.11-slim cannot be pulled here."""
    if subprocess.run(["buildah", "inspect", "--type", "image", BASE],
                      capture_output=True).returncode == 0:
        return BASE
    root = tmp_path / "root"
    mirror = next((m.group(1) for f in Path("/etc/apt").rglob("*.sources")
                   for m in [re.search(r"^URIs:\s*(\S+/debian)\s*$", f.read_text(), re.M)] if m),
                  None)
    _run("debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
         "bookworm", str(root), *([mirror] if mirror else []))
    # this machine's certificate authorities, for pip inside the build to
    # reach the package index as this machine does
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/")
    (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout, capture_output=True,
                         text=True, timeout=600)
    tar.wait()
    assert imp.returncode == 0, imp.stderr
    return BASE


@pytest.mark.slow
def test_image_builds_and_runs_the_demo_as_compose_does(tmp_path):
    why = _no_image_build()
    if why is not None:
        pytest.skip(f"cannot build the image: {why}")
    base = _debian_base(tmp_path)
    tag = f"localhost/dkernel-test:{os.getpid()}"
    _run("buildah", "bud", "--isolation", "chroot", "--network", "host", "--build-arg",
         f"BASE={base}", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(ROOT), timeout=1500)
    container = _run("buildah", "from", tag).stdout.strip()
    try:
        run = ["buildah", "run", "--isolation", "chroot", "--network", "host", "--user",
               "dkernel", "--workingdir", "/home/dkernel", container, "--", "dkernel-entrypoint"]
        demo = _run(*run, "demo", "--out", "/home/dkernel/demo", *SMALL_DEMO, timeout=600)
        assert "[4/4] saved /home/dkernel/demo/model.npz" in demo.stdout + demo.stderr
        _run(*run[:-2], "--", "test", "-s", "/home/dkernel/demo/model.npz")
        version = _run(*run, "job", "--version")
        assert version.stdout.strip() == "dkernel 0.1.0"
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)
        subprocess.run(["buildah", "rmi", tag], capture_output=True)


# ------------------------------------------- Kubernetes, against the API schemas

#: The oldest Kubernetes release the manifests are checked against, besides
#: the newest that kubernetes-validate bundles.
OLDEST_KUBERNETES = "1.29"


def _kubernetes_versions() -> list[str]:
    from kubernetes_validate.utils import latest_version

    return [OLDEST_KUBERNETES, latest_version()]


def _validate(resource: dict, where: str) -> None:
    """Strict validation (unknown fields are errors, as a typo would be) for
    every checked Kubernetes version, offline."""
    import jsonschema
    import kubernetes_validate

    for version in _kubernetes_versions():
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{where} is not a valid {resource['kind']} for Kubernetes "
                        f"{version}: {exc.message} at {list(exc.path)}")


def _pod(spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


def _service(spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "check"}, "spec": spec}


def _manifest(name: str) -> dict:
    import yaml

    (doc,) = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    return doc


def test_fit_job_for_the_helm_cluster_is_a_valid_kubernetes_job():
    pytest.importorskip("kubernetes_validate", reason="in the test extra")
    _validate(_manifest("helm-fit-job.yaml"), "helm-fit-job.yaml")


@pytest.mark.parametrize("name, pods, services", [
    ("daskcluster.yaml", [("spec", "worker", "spec"), ("spec", "scheduler", "spec")],
     [("spec", "scheduler", "service")]),
    ("daskjob.yaml", [("spec", "job", "spec"), ("spec", "cluster", "spec", "worker", "spec"),
                      ("spec", "cluster", "spec", "scheduler", "spec")],
     [("spec", "cluster", "spec", "scheduler", "service")]),
])
def test_dask_operator_resources_hold_valid_pod_and_service_specs(name, pods, services):
    """The dask operator makes Pods and a Service of these specs as they stand
    (the wrappers around them: test_dask_operator_resources_match_the_operators_crd_schema)."""
    pytest.importorskip("kubernetes_validate", reason="in the test extra")
    doc = _manifest(name)

    def at(path: tuple[str, ...]) -> dict:
        node = doc
        for key in path:
            node = node[key]
        return node

    for path in pods:
        _validate(_pod(at(path)), f"{name}: {'.'.join(path)}")
    for path in services:
        _validate(_service(at(path)), f"{name}: {'.'.join(path)}")


#: The dask operator's CustomResourceDefinitions, from dask/dask-kubernetes at
#: 1daa175f (2025-07-04, BSD-3-Clause, LICENSE beside them), gzipped.  The
#: package itself cannot be installed beside s3fs (its kubernetes client wants a
#: python-dateutil that botocore refuses), so its schemas travel with the tests.
OPERATOR_CRDS = ROOT / "tests" / "data" / "dask_operator_crds"


def _crd_schema(kind: str) -> tuple[str, dict]:
    """(apiVersion, openAPIV3Schema) of the operator's CRD for ``kind``."""
    import gzip

    import yaml

    crd = yaml.safe_load(gzip.decompress((OPERATOR_CRDS / f"{kind.lower()}.yaml.gz").read_bytes()))
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
    return f"{crd['spec']['group']}/{version['name']}", version["schema"]["openAPIV3Schema"]


def _unknown_fields(node: object, schema: dict, path: str = "") -> list[str]:
    """Fields the schema does not declare: Kubernetes' strict field validation
    (``kubectl apply --validate=strict``) refuses them; plain JSON Schema
    would let a misspelt key through."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(node, dict):
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties")
            return [f for k, v in node.items()
                    for f in (_unknown_fields(v, extra, f"{path}.{k}")
                              if isinstance(extra, dict) else [])]
        return [f for k, v in node.items()
                for f in ([f"{path}.{k}"] if k not in props
                          else _unknown_fields(v, props[k], f"{path}.{k}"))]
    if isinstance(node, list) and isinstance(schema.get("items"), dict):
        return [f for i, v in enumerate(node)
                for f in _unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def _validate_custom(doc: dict, where: str) -> None:
    import jsonschema  # comes with kubernetes-validate

    api_version, schema = _crd_schema(doc["kind"])
    assert doc["apiVersion"] == api_version, f"{where}: apiVersion {doc['apiVersion']}"
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(doc), key=str)
    assert not errors, f"{where}: {errors[0].message} at {list(errors[0].path)}"
    unknown = _unknown_fields({k: v for k, v in doc.items()
                               if k not in ("apiVersion", "kind", "metadata")}, schema)
    assert not unknown, f"{where}: fields the {doc['kind']} CRD does not declare: {unknown}"


@pytest.mark.parametrize("name", ["daskcluster.yaml", "daskjob.yaml"])
def test_dask_operator_resources_match_the_operators_crd_schema(name):
    """The DaskCluster / DaskJob wrappers themselves (replicas, idleTimeout,
    the job's and the cluster's layout), against the operator's own CRD."""
    pytest.importorskip("kubernetes_validate", reason="in the test extra")
    _validate_custom(_manifest(name), name)


def test_crd_check_refuses_a_misspelt_and_a_mistyped_field():
    pytest.importorskip("kubernetes_validate", reason="in the test extra")
    import copy

    doc = _manifest("daskcluster.yaml")
    typo = copy.deepcopy(doc)
    typo["spec"]["worker"]["replica"] = typo["spec"]["worker"].pop("replicas")
    with pytest.raises(AssertionError, match=r"spec\.worker\.replica\b"):
        _validate_custom(typo, "typo")
    wrong = copy.deepcopy(doc)
    wrong["spec"]["worker"]["replicas"] = "two"
    with pytest.raises(AssertionError, match="is not of type 'integer'"):
        _validate_custom(wrong, "wrong type")


def test_helm_values_that_the_chart_copies_into_its_pods_are_valid():
    """What helm-values.yaml gives the "dask" chart verbatim (the workers' env
    and resources), as part of a pod.  The chart itself cannot be rendered
    here: it is published only in its own chart repository, and no helm
    binary comes from the package registries this project can use."""
    pytest.importorskip("kubernetes_validate", reason="in the test extra")
    import yaml

    values = yaml.safe_load((DEPLOY / "kubernetes" / "helm-values.yaml").read_text())
    for part in ("scheduler", "worker"):
        image = values[part]["image"]
        container = {"name": part, "image": f"{image['repository']}:{image['tag']}",
                     "imagePullPolicy": image["pullPolicy"],
                     **{k: values[part][k] for k in ("env", "resources") if k in values[part]}}
        _validate(_pod({"containers": [container]}), f"helm-values.yaml: {part}")
