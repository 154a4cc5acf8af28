"""A replay's figures as JSON and as text: per rule, and the difference between two
configs by tenant."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ferryman.replay.plot import Panel, Series, svg
from ferryman.replay.replay import Change, Entries, Outcome, Replay, tenant_name

__all__ = ["as_json", "as_text", "differences", "plot"]


def _config(replayed: Replay) -> dict[str, Any]:
    return {
        "decisions": replayed.decisions,
        "refused": replayed.refused,
        "rules": [r.as_dict() for r in replayed.results()],
    }


def _clock(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def differences(changes: dict[Entries, Change], most: int = 10) -> list[dict[str, Any]]:
    """The tenants whose answers differ, most changed first, each with a sentence."""
    changed = [(e, c) for e, c in changes.items() if c.newly_refused or c.newly_allowed]
    changed.sort(key=lambda item: -(item[1].newly_refused + item[1].newly_allowed))
    out: list[dict[str, Any]] = []
    for entries, c in changed[:most]:
        name = tenant_name(entries)
        parts = []
        if c.newly_refused:
            share = 100.0 * c.newly_refused / c.requests
            parts.append(
                f"this change refuses {share:.1f}% of tenant {name}'s requests "
                f"({c.newly_refused} of {c.requests}), all between {_clock(c.first)} "
                f"and {_clock(c.last)}"
            )
        if c.newly_allowed:
            share = 100.0 * c.newly_allowed / c.requests
            parts.append(
                f"it allows {share:.1f}% of tenant {name}'s requests that were refused "
                f"({c.newly_allowed} of {c.requests})"
            )
        out.append(
            {
                "tenant": name,
                "requests": c.requests,
                "newly_refused": c.newly_refused,
                "newly_allowed": c.newly_allowed,
                "first_refused": c.first,
                "last_refused": c.last,
                "summary": "; ".join(parts),
            }
        )
    return out


def as_json(outcome: Outcome) -> dict[str, Any]:
    """``rules`` per rule; with a second config, each under ``config`` and ``against``
    with the ``differences``."""
    head = {
        "decisions": outcome.decisions,
        "errors": outcome.errors,
        "seconds": round(outcome.seconds, 3),
        "decisions_per_second": round(outcome.rate),
    }
    if outcome.against is None:
        return {**head, **_config(outcome.config)}
    return {
        **head,
        "config": _config(outcome.config),
        "against": _config(outcome.against),
        "differences": differences(outcome.changes),
    }


def _rules_text(replayed: Replay) -> list[str]:
    lines = []
    for r in replayed.results():
        first = f", first refusal {_clock(r.first_refusal)}" if r.refused else ""
        shadow = f", {r.shadow} let through by shadow mode" if r.shadow else ""
        lines.append(
            f"  {r.rule}: {r.requests} requests, {r.allowed} allowed, {r.refused} refused"
            f"{shadow}{first}"
        )
        for tenant, n in r.refused_by_tenant.most_common(3):
            lines.append(f"    refused {n}: {tenant_name(tenant)}")
    return lines or ["  (no request reached a rule)"]


def as_text(outcome: Outcome) -> str:
    lines = [
        f"replayed {outcome.decisions} decisions in {outcome.seconds:.2f} s "
        f"({outcome.rate:,.0f} decisions/s)"
        + (f", {outcome.errors} malformed" if outcome.errors else "")
    ]
    if outcome.against is None:
        lines += _rules_text(outcome.config)
        return "\n".join(lines) + "\n"
    lines.append("config:")
    lines += _rules_text(outcome.config)
    lines.append("against:")
    lines += _rules_text(outcome.against)
    found = differences(outcome.changes)
    lines.append("differences:" if found else "differences: none (every answer is the same)")
    lines += [f"  {d['summary']}" for d in found]
    return "\n".join(lines) + "\n"


def plot(outcome: Outcome, most: int = 6) -> str:
    """Allowed and refused per second of the rules with the most requests (each config's
    when there are two), as SVG."""
    panels: list[Panel] = []
    runs = [("", outcome.config)]
    if outcome.against is not None:
        runs = [("config: ", outcome.config), ("against: ", outcome.against)]
    for label, replayed in runs:
        ranked = sorted(replayed.rules.values(), key=lambda r: -r.requests)[:most]
        for r in ranked:
            seconds = sorted(r.seconds)
            span = range(seconds[0], seconds[-1] + 1) if seconds else range(0)
            empty = [0, 0]
            allowed = [(float(s), float(r.seconds.get(s, empty)[0])) for s in span]
            refused = [(float(s), float(r.seconds.get(s, empty)[1])) for s in span]
            panels.append(
                Panel(f"{label}{r.rule}", (Series("allowed", allowed), Series("refused", refused)))
            )
    return svg(panels, "per second: allowed and refused, per rule")
