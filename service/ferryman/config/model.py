"""A whole loaded configuration: every domain, the quota buckets and the lease templates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ferryman.access.policy import Policy
from ferryman.algorithms.leases.model import ResourceTemplate
from ferryman.config.quota import QuotaConfig
from ferryman.core.rules import Domain, Level, Rule
from ferryman.errors import ConfigProblem

__all__ = ["Config"]


@dataclass(frozen=True, eq=False)
class Config:
    """A whole configuration: every domain of every file, loaded all-or-nothing."""

    domains: Mapping[str, Domain]
    files: tuple[str, ...] = ()
    digest: str = ""
    notes: tuple[str, ...] = ()
    # What the reference accepts and ferryman reads as it does, but would rather not see.
    warnings: tuple[ConfigProblem, ...] = ()
    quota: QuotaConfig | None = None  # the token buckets of the quota file, if there is one
    # Capacity lease templates of every resources file, in file order.
    resources: tuple[ResourceTemplate, ...] = ()
    # The access policy (access.yaml), if there is one: without it every caller may.
    access: Policy | None = None

    def iter_limits(self) -> list[tuple[str, Rule]]:
        """Every rule that carries a limit, as (domain, rule), in config order."""
        out: list[tuple[str, Rule]] = []

        def walk(domain: str, level: Level) -> None:
            for rule in level.rules:
                if rule.limit is not None:
                    out.append((domain, rule))
                walk(domain, rule.children)

        for name in sorted(self.domains):
            walk(name, self.domains[name].root)
        return out
