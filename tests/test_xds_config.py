"""CONFIG_TYPE=GRPC_XDS_SOTW: a real `ferryman serve` process takes its descriptors from a
management server (written here, with the real xDS protos) over ADS: the first version is
waited for (or, with FORCE_START_WITHOUT_INITIAL_CONFIG, not), enforced, updated, a bad one
NACKed with the last good kept, and a restarted management server is reconnected to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import any_pb2

from ferryman._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from ferryman.config.xds import load_resources
from ferryman.core.rules import Unit
from ferryman.errors import ConfigError, SettingsError
from ferryman.settings import Settings

from helpers import rate_of
from helpers.certs import Authority
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, overall, rls_stub, wait_for
from helpers.xds_management import ManagementServer, limited, rate_limit_config

Pb = rls_conf_pb2


def _packed(*configs: Pb.RateLimitConfig) -> list[any_pb2.Any]:
    out = []
    for config in configs:
        item = any_pb2.Any()
        item.Pack(config)
        out.append(item)
    return out


def test_a_resource_becomes_the_descriptor_tree_a_file_would_give() -> None:
    """Every field of RateLimitConfig reaches ferryman's model: nested descriptors, units
    (week included), unlimited, names and replaces, shadow_mode, detailed_metric."""
    config = rate_limit_config(
        "shop",
        [
            Pb.RateLimitDescriptor(
                key="user",
                shadow_mode=True,
                detailed_metric=True,
                rate_limit=Pb.RateLimitPolicy(unit=Pb.WEEK, requests_per_unit=7, name="weekly"),
                descriptors=[
                    Pb.RateLimitDescriptor(
                        key="path",
                        value="/buy",
                        rate_limit=Pb.RateLimitPolicy(
                            unit=Pb.SECOND,
                            requests_per_unit=2,
                            replaces=[Pb.RateLimitReplace(name="weekly")],
                        ),
                    )
                ],
            ),
            Pb.RateLimitDescriptor(
                key="vip", rate_limit=Pb.RateLimitPolicy(unlimited=True), quota_mode=True
            ),
        ],
    )
    loaded = load_resources(_packed(config))
    domain = loaded.domains["shop"]
    user, vip = domain.root.rules
    assert user.key == "user" and user.shadow_mode and user.detailed_metric
    assert rate_of(user) is not None
    assert (rate_of(user).unit, rate_of(user).requests_per_unit) == (Unit.WEEK, 7)
    (path,) = user.children.rules
    assert (path.key, path.value) == ("path", "/buy")
    assert rate_of(path) is not None and rate_of(path).replaces == ("weekly",)
    assert rate_of(vip) is not None and rate_of(vip).unlimited and vip.quota_mode
    assert domain.files == ("xds:shop",)


def test_a_bad_resource_is_refused_with_its_name_and_path() -> None:
    """The same validation as the YAML loader: the problem names the resource and the path
    (no line numbers of a YAML nobody wrote); a foreign type is refused too."""
    missing_unit = rate_limit_config(
        "shop", [Pb.RateLimitDescriptor(key="k", rate_limit=Pb.RateLimitPolicy(name="x"))]
    )
    with pytest.raises(ConfigError) as caught:
        load_resources(_packed(missing_unit))
    assert str(caught.value) == "xds:shop: descriptors[0].rate_limit: missing 'unit' " + (
        "(second, minute, hour, day, week, month or year), 'window' (a duration such as 30s), "
        "or 'calendar' (the reference refuses this file too: at descriptors[0].rate_limit: "
        "invalid rate limit unit '')"
    )
    twice = _packed(rate_limit_config("a", []), rate_limit_config("a", []))
    with pytest.raises(ConfigError, match="domain 'a' is already defined in xds:a"):
        load_resources(twice)
    assert load_resources(twice, merge_domains=True).domains.keys() == {"a"}
    foreign = any_pb2.Any(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster")
    with pytest.raises(ConfigError, match=r"xds resource 0: type .*Cluster' is not"):
        load_resources([foreign])


def test_xds_settings_are_read_with_the_reference_defaults() -> None:
    s = Settings.from_env({"CONFIG_TYPE": "GRPC_XDS_SOTW"})
    assert (s.xds_server_url, s.xds_node_id, s.xds_connect_retry_interval) == (
        "localhost:18000",
        "default",
        3.0,
    )
    assert (s.xds_backoff_initial_interval, s.xds_backoff_max_interval) == (10.0, 60.0)
    assert (s.xds_backoff_random_factor, s.xds_backoff_jitter) == (0.5, True)
    s = Settings.from_env(
        {
            "CONFIG_GRPC_XDS_NODE_METADATA": "zone=a,team=edge",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token:abc",
        }
    )
    assert s.xds_node_metadata == (("zone", "a"), ("team", "edge"))
    assert s.xds_additional_headers == (("x-token", "abc"),)
    with pytest.raises(SettingsError, match="CONFIG_TYPE='GRPC_XDS'"):
        Settings.from_env({"CONFIG_TYPE": "GRPC_XDS"})
    with pytest.raises(SettingsError, match="CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"):
        Settings.from_env({"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "c.pem"})
    with pytest.raises(SettingsError, match="XDS_CLIENT_BACKOFF_RANDOM_FACTOR"):
        Settings.from_env({"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "2"})


@pytest.fixture
def management() -> Iterator[ManagementServer]:
    server = ManagementServer().start()
    yield server
    server.close()


def _ask(process: ServeProcess, key: str, value: str) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
        request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([(key, value)])])
        return overall(rls_stub(channel).ShouldRateLimit(request, timeout=5))


def test_versions_from_a_management_server_are_applied_nacked_and_survive_its_restart(
    tmp_path: Path, management: ManagementServer
) -> None:
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{management.port}",
        "CONFIG_GRPC_XDS_NODE_ID": "edge-1",
        "CONFIG_GRPC_XDS_NODE_METADATA": "zone=eu-1",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token:s3cret",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "200ms",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "200ms",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1s",
    }
    # No descriptors/ directory: the configuration comes from xDS only.
    process = ServeProcess(tmp_path, env)
    try:
        # Subscribed, with the node and headers asked for, and not serving until a version
        # has arrived (as the reference waits for its first configuration).
        wait_for("the subscription", lambda: management.requests, timeout=30)
        first = management.requests[0]
        assert first.type_url == "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
        assert (first.node.id, first.version_info, first.response_nonce) == ("edge-1", "", "")
        assert dict(first.node.metadata) == {"zone": "eu-1"}
        assert management.headers[0]["x-token"] == "s3cret"
        assert not process.serving()

        management.set("v1", [rate_limit_config("d", [limited("k", "a", 2)])])
        process.wait_serving()
        assert management.acks() == [("v1", "1")]
        assert [_ask(process, "k", "a") for _ in range(3)] == ["OK", "OK", "OVER_LIMIT"]
        assert "xds 127.0.0.1:" in process.text  # the start line names the source

        # An update applies: a new key, the old one gone.
        management.set("v2", [rate_limit_config("d", [limited("k", "b", 1)])])
        wait_for("ACK of v2", lambda: ("v2", "2") in management.acks())
        assert [_ask(process, "k", "b") for _ in range(2)] == ["OK", "OVER_LIMIT"]
        assert _ask(process, "k", "a") == "OK"  # no longer limited

        # A bad version is NACKed with the problem; v2 stays in force.
        bad = rate_limit_config("d", [Pb.RateLimitDescriptor(key="k", value="c", rate_limit={})])
        management.set("v3", [bad])
        wait_for("NACK of v3", management.nacks)
        (nack,) = management.nacks()
        assert (nack.version_info, nack.response_nonce) == ("v2", "3")
        assert nack.error_detail.message == (
            "xds:d: descriptors[0].rate_limit: missing 'unit' "
            "(second, minute, hour, day, week, month or year), 'window' (a duration such as "
            "30s), or 'calendar' (the reference refuses this file too: at "
            "descriptors[0].rate_limit: invalid rate limit unit '')"
        )
        assert _ask(process, "k", "b") == "OVER_LIMIT"
        assert "config rejected, xDS version 'v3', keeping version 2" in process.text

        # The management server restarts (on the same port, with a new version): ferryman
        # reconnects, asking with the version in force, and applies the new one.
        asked_before = len(management.requests)
        management.stop()
        management.set("v4", [rate_limit_config("d", [limited("k", "d", 1)])])
        wait_for("the stream to break", lambda: "reconnecting in" in process.text, timeout=10)
        management.start()
        wait_for("ACK of v4", lambda: ("v4", "4") in management.acks(), timeout=15)
        again = management.requests[asked_before]
        assert (again.version_info, again.node.id, again.response_nonce) == ("v2", "edge-1", "")
        assert [_ask(process, "k", "d") for _ in range(2)] == ["OK", "OVER_LIMIT"]
        assert process.stop() == 0
    finally:
        process.kill()


def test_force_start_serves_at_once_and_applies_the_first_version_when_it_comes(
    tmp_path: Path, management: ManagementServer
) -> None:
    """FORCE_START_WITHOUT_INITIAL_CONFIG=true: serving before any version, every call
    answered "no rate limit configuration is loaded"; the first version then applies."""
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{management.port}",
        "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
    }
    process = ServeProcess(tmp_path, env)
    try:
        process.wait_serving()
        wait_for("the subscription", lambda: management.requests, timeout=30)
        assert management.sent == []  # nothing to apply yet
        with pytest.raises(grpc.RpcError) as caught:
            _ask(process, "k", "a")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no rate limit configuration is loaded" in str(caught.value.details())
        management.set("v1", [rate_limit_config("d", [limited("k", "a", 1)])])
        wait_for("ACK of v1", lambda: ("v1", "1") in management.acks())
        assert [_ask(process, "k", "a") for _ in range(2)] == ["OK", "OVER_LIMIT"]
        assert process.stop() == 0
    finally:
        process.kill()


def test_the_management_server_is_reached_over_mutual_tls(tmp_path: Path) -> None:
    """CONFIG_GRPC_XDS_SERVER_USE_TLS with the CA, a client certificate and the server's
    name to verify (its certificate names xds.example only, not the address dialled)."""
    ca = Authority(tmp_path / "ca")
    server = ca.issue("xds", dns=("xds.example",))
    client = ca.client()
    credentials = grpc.ssl_server_credentials(
        [(server.key.read_bytes(), server.cert_bytes)],
        root_certificates=ca.cert.read_bytes(),
        require_client_auth=True,
    )
    management = ManagementServer(tls=credentials).start()
    management.set("v1", [rate_limit_config("d", [limited("k", "a", 1)])])
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{management.port}",
        "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": str(ca.cert),
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": str(client.cert),
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": str(client.key),
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "xds.example",
    }
    process = ServeProcess(tmp_path, env)
    try:
        process.wait_serving()
        assert management.acks() == [("v1", "1")]
        assert [_ask(process, "k", "a") for _ in range(2)] == ["OK", "OVER_LIMIT"]
    finally:
        process.kill()
        management.close()
