"""Configuration from an xDS management server (CONFIG_TYPE=GRPC_XDS_SOTW).

Ferryman subscribes over ADS (state of the world) to the reference service's resource type,
``ratelimit.config.ratelimit.v3.RateLimitConfig``: each response carries every domain, at
one version. A version is applied like a file reload: each resource becomes the descriptor
document it stands for and goes through the loader's validation, the Config is swapped into
the same ConfigHolder, and the version is ACKed; a version that does not load is NACKed
with the problems in ``error_detail`` and the last good Config stays in force.

A stream that breaks after it delivered a version is opened again after
CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL (+/-50%); attempts that get no response back
off exponentially (XDS_CLIENT_BACKOFF_*). Each new stream asks with the version in force.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, struct_pb2
from google.protobuf.message import DecodeError

from ferryman._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from ferryman._version import __version__
from ferryman.config.loader import load_sources
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder, reject_config, swap_config
from ferryman.errors import ConfigError, ConfigProblem, SettingsError
from ferryman.settings import Settings
from ferryman.stats import Stats
from ferryman.tasks import cancel

__all__ = ["TYPE_URL", "XdsClient", "load_resources", "resource_document"]

log = logging.getLogger("ferryman.config")

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
_INVALID_ARGUMENT = 3  # google.rpc.Code


def _descriptor(d: rls_conf_pb2.RateLimitDescriptor) -> dict[str, Any]:
    """One descriptor node as the YAML a descriptor file would hold."""
    node: dict[str, Any] = {"key": d.key}
    if d.value:
        node["value"] = d.value
    if d.HasField("rate_limit"):
        p = d.rate_limit
        limit: dict[str, Any] = {}
        if p.unit != rls_conf_pb2.UNKNOWN:
            limit["unit"] = rls_conf_pb2.RateLimitUnit.Name(p.unit).lower()
        if p.requests_per_unit or "unit" in limit:
            limit["requests_per_unit"] = p.requests_per_unit
        if p.unlimited:
            limit["unlimited"] = True
        if p.name:
            limit["name"] = p.name
        if p.replaces:
            limit["replaces"] = [{"name": r.name} for r in p.replaces]
        node["rate_limit"] = limit
    for flag in ("shadow_mode", "detailed_metric", "quota_mode"):
        if getattr(d, flag):
            node[flag] = True
    if d.descriptors:
        node["descriptors"] = [_descriptor(child) for child in d.descriptors]
    return node


def resource_document(config: rls_conf_pb2.RateLimitConfig) -> str:
    """The descriptor document (YAML) a RateLimitConfig stands for."""
    document: dict[str, Any] = {"domain": config.domain}
    if config.descriptors:
        document["descriptors"] = [_descriptor(d) for d in config.descriptors]
    return yaml.safe_dump(document, sort_keys=False)


def _problem(where: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(where, None, None, "", message)])


def load_resources(
    resources: Sequence[any_pb2.Any], *, merge_domains: bool = False, strict: bool = False
) -> Config:
    """A Config from one response's resources, validated as descriptor files are; raises
    ConfigError naming each resource (``xds:NAME``) and the path of each problem."""
    sources: list[tuple[str, str]] = []
    for i, packed in enumerate(resources):
        where = f"xds resource {i}"
        if packed.type_url != TYPE_URL:
            raise _problem(where, f"type {packed.type_url!r} is not {TYPE_URL}")
        message = rls_conf_pb2.RateLimitConfig()
        try:
            if not packed.Unpack(message):
                raise _problem(where, "does not unpack as a RateLimitConfig")
        except DecodeError as exc:
            raise _problem(where, f"does not decode as a RateLimitConfig: {exc}") from None
        sources.append((f"xds:{message.name or i}", resource_document(message)))
    try:
        config = load_sources(sources, merge_domains=merge_domains, strict=strict)
    except ConfigError as exc:
        # Lines and columns are those of the generated YAML, which nobody sees: the
        # resource name and the path say where the problem is.
        raise ConfigError([replace(p, line=None, column=None) for p in exc.problems]) from None
    warnings = tuple(replace(w, line=None, column=None) for w in config.warnings)
    return replace(config, warnings=warnings)


def _read(path: str, name: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"{name}={path!r} cannot be read: {exc.strerror}") from None


class XdsClient:
    """Keeps the ConfigHolder in step with the management server's RateLimitConfigs."""

    def __init__(self, settings: Settings, holder: ConfigHolder, stats: Stats) -> None:
        self.settings = settings
        self.holder = holder
        self._stats = stats
        self.target = settings.xds_server_url
        self.version = ""  # the management server's version in force ("" before any)
        self.acks = 0
        self.nacks = 0
        self.connects = 0
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Event | None = None
        self._received = False
        self._credentials = self._channel_credentials()
        self._metadata = tuple((k.lower(), v) for k, v in settings.xds_additional_headers)
        metadata = struct_pb2.Struct()
        for key, value in settings.xds_node_metadata:
            metadata[key] = value
        self._node = base_pb2.Node(
            id=settings.xds_node_id,
            metadata=metadata,
            user_agent_name="ferryman",
            user_agent_version=__version__,
        )

    def _channel_credentials(self) -> grpc.ChannelCredentials | None:
        s = self.settings
        if not s.xds_server_use_tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(s.xds_server_tls_cacert, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
            if s.xds_server_tls_cacert
            else None,
            private_key=_read(s.xds_client_tls_key, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
            if s.xds_client_tls_key
            else None,
            certificate_chain=_read(s.xds_client_tls_cert, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
            if s.xds_client_tls_cert
            else None,
        )

    def describe(self) -> str:
        return f"xds {self.target} (node {self.settings.xds_node_id})"

    def load(self, *, keep_serving: bool = True, missing_ok: bool = False) -> None:
        """Nothing to read before the stream starts: versions arrive on it (``start``)."""

    async def start(self) -> None:
        """Subscribe; unless FORCE_START_WITHOUT_INITIAL_CONFIG, return once the first
        version has been applied or rejected (as the reference waits for its first one)."""
        self._first = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="ferryman-xds")
        if not self.settings.force_start_without_initial_config:
            log.info("waiting for the first configuration from %s", self.describe())
            await self._first.wait()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel(self._task)
            self._task = None

    def _request(self, nonce: str = "", error: str | None = None) -> discovery_pb2.DiscoveryRequest:
        request = discovery_pb2.DiscoveryRequest(
            version_info=self.version,
            node=self._node,
            type_url=TYPE_URL,
            response_nonce=nonce,
        )
        if error is not None:
            request.error_detail.code = _INVALID_ARGUMENT
            request.error_detail.message = error
        return request

    def _channel(self) -> grpc.aio.Channel:
        s = self.settings
        options: list[tuple[str, Any]] = []
        if s.xds_max_msg_size > 0:
            options.append(("grpc.max_receive_message_length", s.xds_max_msg_size))
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        if s.xds_server_tls_san:
            options.append(("grpc.ssl_target_name_override", s.xds_server_tls_san))
        return grpc.aio.secure_channel(self.target, self._credentials, options=options)

    def _delay(self, failures: int) -> float:
        """How long to wait before the next attempt."""
        s = self.settings
        if self._received:
            # The stream worked: the server went away. Retry at the connect interval.
            interval = s.xds_connect_retry_interval
            return random.uniform(interval * 0.5, interval * 1.5)
        step = min(s.xds_backoff_max_interval, s.xds_backoff_initial_interval * 2**failures)
        if s.xds_backoff_jitter and s.xds_backoff_random_factor > 0:
            spread = step * s.xds_backoff_random_factor
            step = random.uniform(step - spread, step + spread)
        return max(0.0, float(step))

    async def _run(self) -> None:
        failures = 0
        while True:
            self._received = False
            try:
                await self._session()
                problem = "the server ended the stream"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                problem = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # a bug, not the server: keep the config, keep trying
                log.exception("xDS client failed unexpectedly")
                problem = f"{type(exc).__name__}: {exc}"
            delay = self._delay(failures)
            failures = 0 if self._received else failures + 1
            log.warning(
                "xDS server %s: %s; keeping version %r, reconnecting in %.2fs",
                self.target,
                problem,
                self.version,
                delay,
            )
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        async with self._channel() as channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.StreamAggregatedResources(metadata=self._metadata)
            await call.write(self._request())
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:  # type: ignore[attr-defined]
                    return
                assert isinstance(response, discovery_pb2.DiscoveryResponse)
                if not self._received:
                    self._received = True
                    self.connects += 1
                    log.info("xDS stream to %s open (node %s)", self.target, self._node.id)
                if response.type_url != TYPE_URL:
                    log.debug("xDS response of type %s ignored", response.type_url)
                    continue
                await call.write(await self._apply(response))

    async def _apply(
        self, response: discovery_pb2.DiscoveryResponse
    ) -> discovery_pb2.DiscoveryRequest:
        """Apply one version; the ACK or the NACK that answers it."""
        try:
            config = await asyncio.to_thread(
                load_resources,
                list(response.resources),
                merge_domains=self.settings.merge_domain_config,
                strict=self.settings.strict_config,
            )
        except ConfigError as exc:
            keeping = (
                f"keeping version {self.holder.version} (xDS version {self.version!r})"
                if self.holder.config is not None
                else "still no configuration loaded"
            )
            reject_config(
                self.holder, self._stats, exc, f"xDS version {response.version_info!r}, {keeping}"
            )
            self.nacks += 1
            self._set_first()
            return self._request(response.nonce, error=str(exc))
        self.acks += 1
        current = self.holder.config
        if current is not None and current.digest == config.digest:
            # The same descriptors again (a new stream resends what is in force): ACK only.
            self.version = response.version_info
            log.info("xDS version %r: no change", self.version)
            self._set_first()
            return self._request(response.nonce)
        change, fields = swap_config(self.holder, self._stats, config)
        self.version = response.version_info
        log.info(
            "config from xDS version %r applied (version %d): %s",
            self.version,
            self.holder.version,
            change,
            extra={"fields": {**fields, "xds_version": self.version}},
        )
        self._set_first()
        return self._request(response.nonce)

    def _set_first(self) -> None:
        if self._first is not None:
            self._first.set()
