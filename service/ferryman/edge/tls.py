"""TLS for every port from one set of PEM files (the reference's GRPC_SERVER_TLS_* names).

The files are re-read when they change (cert-manager rotates them in place or by a symlink
swap): gRPC asks for the certificate configuration at each new handshake, and the HTTP
ports pick the newest SSL context in their SNI callback, so new connections get the new
certificate and established ones (streams included) are left alone. A pair that does not
load (half written, key and certificate from different rotations) is logged and the last
good one stays in use.

With a client CA (GRPC_CLIENT_TLS_CACERT) the gRPC port requires a client certificate it
can verify, and GRPC_CLIENT_TLS_SAN further requires one of its subject alternative names
to equal the given value (checked per call, from the connection's auth context). The HTTP
ports ask for a client certificate without requiring it, so that probes still reach
``/healthcheck``; what changes state there (``POST /json``) needs a verified one.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ferryman.errors import SettingsError
from ferryman.settings import Settings

__all__ = ["TlsFiles", "peer_names"]

log = logging.getLogger("ferryman.tls")

# The auth context property gRPC fills with every SAN of the peer's certificate.
_SAN_PROPERTY = "x509_subject_alternative_name"

Stamp = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class _Loaded:
    stamp: Stamp
    cert: bytes
    key: bytes
    ca: bytes | None
    context: ssl.SSLContext


class TlsFiles:
    """The server's certificate, key and (for mutual TLS) client CA, kept current."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None, client_san: str) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.client_san = client_san
        self._lock = threading.Lock()
        self._bad: Stamp | None = None  # the stamp last reported as unloadable
        self.reloads = 0
        self._current = self._load(self._stamp(strict=True), strict=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> TlsFiles | None:
        """None when TLS is off; raises SettingsError naming the variable of a bad file."""
        s = settings
        if not s.grpc_server_use_tls:
            return None
        ca = Path(s.grpc_client_tls_cacert) if s.grpc_client_tls_cacert else None
        return cls(
            Path(s.grpc_server_tls_cert), Path(s.grpc_server_tls_key), ca, s.grpc_client_tls_san
        )

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def _paths(self) -> list[tuple[str, Path]]:
        paths = [("GRPC_SERVER_TLS_CERT", self.cert), ("GRPC_SERVER_TLS_KEY", self.key)]
        if self.client_ca is not None:
            paths.append(("GRPC_CLIENT_TLS_CACERT", self.client_ca))
        return paths

    def _stamp(self, strict: bool = False) -> Stamp:
        stamps = []
        for name, path in self._paths():
            try:
                st = os.stat(path)  # follows symlinks: a Secret volume swaps a `..data` link
            except OSError as exc:
                if strict:
                    raise SettingsError(f"{name}={str(path)!r}: {exc.strerror}") from None
                raise
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def _load(self, stamp: Stamp, strict: bool = False) -> _Loaded:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            if strict:
                raise SettingsError(
                    f"GRPC_SERVER_TLS_CERT={str(self.cert)!r} / GRPC_SERVER_TLS_KEY="
                    f"{str(self.key)!r}: not a matching PEM certificate and key ({exc})"
                ) from None
            raise
        ca = None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(self.client_ca)
                ca = self.client_ca.read_bytes()
            except (OSError, ssl.SSLError) as exc:
                if strict:
                    raise SettingsError(
                        f"GRPC_CLIENT_TLS_CACERT={str(self.client_ca)!r}: "
                        f"not a PEM CA certificate ({exc})"
                    ) from None
                raise
            context.verify_mode = ssl.CERT_OPTIONAL
        cert, key = self.cert.read_bytes(), self.key.read_bytes()
        context.sni_callback = self._pick_context
        return _Loaded(stamp, cert, key, ca, context)

    def _refresh(self) -> tuple[_Loaded, bool]:
        """The current files, re-read if they changed; (loaded, changed)."""
        with self._lock:
            current = self._current
            try:
                stamp = self._stamp()
            except OSError:
                return current, False  # mid-rotation: a file is briefly missing
            if stamp == current.stamp or stamp == self._bad:
                return current, False
            try:
                loaded = self._load(stamp)
                if self._stamp() != stamp:
                    return current, False  # written to while read: take it next time
            except (OSError, ssl.SSLError) as exc:
                self._bad = stamp
                log.warning(
                    "TLS files changed but do not load, keeping the previous certificate: %s",
                    exc,
                )
                return current, False
            self._current = loaded
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.cert)
            return loaded, True

    # gRPC ----------------------------------------------------------------------------------

    def _grpc_config(self, loaded: _Loaded) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(loaded.key, loaded.cert)], root_certificates=loaded.ca
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC at each new handshake: None keeps the configuration it has.
        try:
            loaded, changed = self._refresh()
        except Exception:  # never let a surprise here fail the handshake machinery
            log.exception("TLS certificate reload failed")
            return None
        return self._grpc_config(loaded) if changed else None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(self._current),
            self._fetch,  # type: ignore[arg-type]  # the stubs forget that None means "unchanged"
            require_client_authentication=self.mutual,
        )

    async def authorize(self, context: Any) -> None:
        """Abort a call whose client certificate lacks the required SAN."""
        if not self.client_san:
            return
        names = peer_names(context.auth_context().get(_SAN_PROPERTY, ()))
        if self.client_san not in names:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client certificate has no subject alternative name {self.client_san!r} "
                "(GRPC_CLIENT_TLS_SAN)",
            )

    # HTTP ----------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """The context the HTTP listeners start with; handshakes move to the newest one."""
        return self._current.context

    def _pick_context(self, sock: Any, server_name: str | None, initial: ssl.SSLContext) -> None:
        loaded, _ = self._refresh()
        if sock.context is not loaded.context:
            sock.context = loaded.context

    def http_denied(self, peercert: Mapping[str, Any] | None) -> str | None:
        """Why a state-changing HTTP request may not proceed on this connection, or None."""
        if not self.mutual:
            return None
        if not peercert:
            return "a client certificate is required (GRPC_CLIENT_TLS_CACERT)"
        if self.client_san:
            sans = peercert.get("subjectAltName", ())
            if self.client_san not in {str(value) for _kind, value in sans}:
                return (
                    f"client certificate has no subject alternative name {self.client_san!r} "
                    "(GRPC_CLIENT_TLS_SAN)"
                )
        return None


def peer_names(values: Iterable[bytes | str]) -> set[str]:
    return {v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values}
