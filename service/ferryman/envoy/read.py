"""Reading Envoy files into typed messages (``envoy-data-plane``): bootstraps, bare
Listeners and RouteConfigurations, and the patch values of Istio EnvoyFilter manifests.

Every ``@type`` in a file is imported before the file is parsed, since a message packed in an
``Any`` is unpacked as it is read; a type the package does not know is reported with its
YAML path, never crashed on.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ferryman.errors import EnvoyFileError

__all__ = ["Piece", "message_class", "quiet", "read_file", "read_text"]

_PREFIX = "type.googleapis.com/"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No DeprecationWarning: the generated models use a pydantic form deprecated in 2.12,
    and reading a deprecated Envoy field (Envoy warns about those itself) warns too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _module(package: str) -> Any:
    with quiet():
        return importlib.import_module(f"envoy_data_plane.{package}")


def message_class(package: str, name: str) -> Any:
    """The generated class of the message ``package.name``. envoy-data-plane names a class
    by its proto name with acronyms in CamelCase (``SourceIPInput`` is ``SourceIpInput``),
    so a name missing as written is looked up without regard to case."""
    module = _module(package)
    found = getattr(module, name, None)
    if found is None:
        folded = name.casefold()
        found = next((v for k, v in vars(module).items() if k.casefold() == folded), None)
    if found is None:
        raise AttributeError(f"{package}.{name}")
    return found


# What a whole file or an EnvoyFilter patch holds, by its applyTo.
_PATCHES = {
    "LISTENER": ("envoy.config.listener.v3", "Listener"),
    "FILTER_CHAIN": ("envoy.config.listener.v3", "FilterChain"),
    "NETWORK_FILTER": ("envoy.config.listener.v3", "Filter"),
    "HTTP_FILTER": (
        "envoy.extensions.filters.network.http_connection_manager.v3",
        "HttpFilter",
    ),
    "ROUTE_CONFIGURATION": ("envoy.config.route.v3", "RouteConfiguration"),
    "VIRTUAL_HOST": ("envoy.config.route.v3", "VirtualHost"),
    "HTTP_ROUTE": ("envoy.config.route.v3", "Route"),
    "CLUSTER": ("envoy.config.cluster.v3", "Cluster"),
}


@dataclass(frozen=True)
class Piece:
    """One typed message read from a file: ``kind`` is Bootstrap, Listener, VirtualHost...;
    ``where`` the YAML path of its value in the file."""

    file: str
    where: str
    kind: str
    message: Any


def _import_types(file: str, node: object, path: str) -> None:
    """Import the module of every ``@type`` below ``node``; unknown ones are errors."""
    if isinstance(node, dict):
        type_url = node.get("@type")
        if type_url is not None:
            where = f"{path}.@type" if path else "@type"
            if not isinstance(type_url, str) or not type_url.startswith(_PREFIX):
                raise EnvoyFileError(file, where, f"{type_url!r} is not type.googleapis.com/...")
            package, _, name = type_url[len(_PREFIX) :].rpartition(".")
            try:
                found = message_class(package, name) is not None
            except (ImportError, AttributeError):
                found = False
            if not found:
                raise EnvoyFileError(file, where, f"unknown type {type_url}")
        for key, value in node.items():
            _import_types(file, value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _import_types(file, value, f"{path}[{i}]")


def _parse(file: str, where: str, kind: tuple[str, str], value: object) -> Piece:
    if not isinstance(value, dict):
        raise EnvoyFileError(file, where, f"a {kind[1]} must be a mapping")
    _import_types(file, value, where)
    cls = message_class(*kind)
    try:
        with quiet():
            message = cls.from_dict(value)
    except KeyError as exc:
        # "Unknown field 'nmae' in message Listener."
        raise EnvoyFileError(file, where, str(exc.args[0]).rstrip(".")) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        detail = f"invalid {exc.title}: {field}: {first['msg']}"
        raise EnvoyFileError(file, where, detail) from None
    except (ValueError, TypeError) as exc:
        raise EnvoyFileError(file, where, f"invalid {kind[1]}: {exc}") from None
    return Piece(file, where, kind[1], message)


def _document(file: str, doc: object, index: int, many: bool) -> list[Piece]:
    at = f"document {index}" if many else ""
    if not isinstance(doc, dict):
        raise EnvoyFileError(file, at, "not a mapping")
    if doc.get("kind") == "EnvoyFilter":
        spec = doc.get("spec") or {}
        patches = spec.get("configPatches") if isinstance(spec, dict) else None
        if not isinstance(patches, list):
            raise EnvoyFileError(file, f"{at} spec.configPatches".strip(), "must be a list")
        pieces = []
        for i, patch in enumerate(patches):
            where = f"{at} spec.configPatches[{i}]".strip()
            if not isinstance(patch, dict):
                raise EnvoyFileError(file, where, "not a mapping")
            apply_to = patch.get("applyTo")
            kind = _PATCHES.get(str(apply_to))
            if kind is None:
                raise EnvoyFileError(file, f"{where}.applyTo", f"unknown applyTo {apply_to!r}")
            body = patch.get("patch") or {}
            if isinstance(body, dict) and body.get("operation") == "REMOVE":
                continue
            value = body.get("value") if isinstance(body, dict) else None
            pieces.append(_parse(file, f"{where}.patch.value", kind, value))
        return pieces
    if "kind" in doc and "apiVersion" in doc:
        return []  # another Kubernetes object next to the EnvoyFilters
    if "static_resources" in doc or "staticResources" in doc or "admin" in doc:
        kind = ("envoy.config.bootstrap.v3", "Bootstrap")
    elif "virtual_hosts" in doc or "virtualHosts" in doc:
        kind = _PATCHES["ROUTE_CONFIGURATION"]
    elif "filter_chains" in doc or "filterChains" in doc or "address" in doc:
        kind = _PATCHES["LISTENER"]
    else:
        raise EnvoyFileError(
            file,
            at,
            "neither an Envoy bootstrap, a Listener, a RouteConfiguration nor an Istio EnvoyFilter",
        )
    return [_parse(file, at, kind, doc)]


def read_text(file: str, text: str) -> list[Piece]:
    """The typed messages of one file's text (YAML or JSON, one or more documents)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise EnvoyFileError(file, where, f"invalid YAML: {problem}") from None
    pieces: list[Piece] = []
    for i, doc in enumerate(docs):
        pieces.extend(_document(file, doc, i, len(docs) > 1))
    return pieces


def read_file(path: Path) -> list[Piece]:
    """The typed messages of one file; EnvoyFileError when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvoyFileError(str(path), "", f"cannot read: {exc}") from None
    return read_text(str(path), text)
