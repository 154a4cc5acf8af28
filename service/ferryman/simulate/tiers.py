"""The tier simulator: a traffic shape sent to one node, second by second, through the real
engine on the memory backend and a virtual clock.

The node is any rule of a configuration (or a node pasted as YAML): a node whose kind answers
ferryman.v1's ``Request`` (burst tiers, token buckets) is asked through it, and its answer's
fields (the tier in use, whether it burst, a hard limit reached...) are shown as the kind
names them; any other node is asked through ShouldRateLimit. No kind is named here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.model import Config
from ferryman.core.answers import Code, DescriptorRequest
from ferryman.engine import RateLimitEngine
from ferryman.errors import NotFoundError, RequestError
from ferryman.stats import Stats

__all__ = ["Second", "Shape", "node_config", "simulate"]

#: The virtual clock's start: a multiple of every unit up to a day.
START = 1_700_006_400.0
#: The domain and key a pasted node is simulated under.
DOMAIN, KEY, TENANT = "simulated", "tenant", "t"


@dataclass(frozen=True)
class Shape:
    """Requests over ``seconds``: ``rate`` per second, spread evenly, sent only during the
    ``on`` seconds of each ``on + off`` cycle (all the time when ``off`` is 0), plus
    ``bursts`` of (second, requests) sent at once."""

    seconds: int = 60
    rate: float = 0.0
    on: float = 0.0
    off: float = 0.0
    bursts: tuple[tuple[float, int], ...] = ()

    def times(self) -> list[float]:
        """Every request's time, in seconds from the start, in order."""
        out: list[float] = []
        if self.rate > 0:
            step = 1.0 / self.rate
            n = math.ceil(self.seconds * self.rate)
            cycle = self.on + self.off
            for i in range(n):
                t = i * step
                if self.off > 0 and cycle > 0 and (t % cycle) >= self.on:
                    continue
                out.append(t)
        for at, count in self.bursts:
            if 0 <= at < self.seconds:
                out.extend([at] * count)
        return sorted(out)


@dataclass
class Second:
    """One second of the simulation: requests asked, granted and refused, and the last
    answer's fields."""

    second: int
    asked: int = 0
    granted: int = 0
    refused: int = 0
    fields: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "second": self.second,
            "asked": self.asked,
            "granted": self.granted,
            "refused": self.refused,
            **self.fields,
        }


def node_config(node: str) -> Config:
    """A configuration of one domain whose one node is ``node`` (YAML: the node's keys,
    e.g. a rule kind's list of tiers), keyed by tenant."""
    try:
        fields = yaml.safe_load(node)
    except yaml.YAMLError as exc:
        raise RequestError("node", f"not YAML: {exc}") from None
    if not isinstance(fields, dict):
        raise RequestError("node", "give the node's keys as a YAML map, e.g. {kind: [...]}")
    text = yaml.safe_dump(
        {"domain": DOMAIN, "descriptors": [{"key": KEY, **fields}]}, sort_keys=False
    )
    return load_sources([("node.yaml", text)])


class _Source:
    def __init__(self, config: Config) -> None:
        self.config: Config | None = config


async def simulate(
    config: Config, domain: str, entries: Sequence[tuple[str, str]], shape: Shape
) -> list[Second]:
    """Each second of ``shape`` sent to the node ``entries`` reach in ``domain``."""
    clock = ManualClock(START)
    engine = RateLimitEngine(_Source(config), MemoryBackend(clock), clock, Stats())
    seconds = [Second(s) for s in range(shape.seconds)]
    asked = tuple(entries)
    requests = True
    for t in shape.times():
        clock.set(START + t)
        row = seconds[int(t)]
        row.asked += 1
        granted = False
        if requests:
            try:
                answer = await engine.request(domain, asked, 1, 1, 0)
            except NotFoundError:
                raise
            except RequestError:  # not a kind that answers Request: ask as Envoy does
                requests = False
            else:
                granted = answer.granted > 0
                row.fields = {**answer.fields, **answer.durations}
        if not requests:
            decision = await engine.should_rate_limit(domain, [DescriptorRequest(asked)])
            granted = decision.code is Code.OK
            status = decision.statuses[0]
            limit = status.limit
            row.fields = {
                "limit": None if limit is None else limit.requests_per_unit,
                "remaining": status.remaining,
            }
        if granted:
            row.granted += 1
        else:
            row.refused += 1
    return seconds
