"""The quota file kind: its defaults, its lookup order, and errors with file, line and path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferryman.algorithms.token_bucket.model import DEFAULT_BUCKET, GLOBAL_NAMESPACE, BucketSpec
from ferryman.config.loader import load_sources
from ferryman.errors import ConfigError

DOMAIN = (
    "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
)

QUOTA = """\
global_default_bucket: {size: 7}
namespaces:
  pay:
    max_dynamic_buckets: 5
    dynamic_bucket_template: {fill_rate: 2.5, max_idle_millis: 60000}
    buckets:
      card: {size: 10, fill_rate: 10, wait_timeout_millis: 0, max_debt_millis: 0,
             max_tokens_per_request: 3}
  shop:
    default_bucket:
"""


def test_quota_file_is_read_beside_descriptor_files() -> None:
    """A file with the quota keys becomes Config.quota; descriptor files load as before."""
    config = load_sources([("app.yaml", DOMAIN), ("quota.yaml", QUOTA)])
    assert set(config.domains) == {"app"}
    quota = config.quota
    assert quota is not None and quota.file == "quota.yaml"
    assert quota.global_default_bucket == BucketSpec(size=7)
    pay = quota.namespaces["pay"]
    assert pay.max_dynamic_buckets == 5
    assert pay.dynamic_bucket_template == BucketSpec(fill_rate=2.5, max_idle_millis=60000)
    assert pay.buckets["card"] == BucketSpec(10, 10.0, 0, 0, 3.0, -1)
    assert quota.namespaces["shop"].default_bucket == BucketSpec()


def test_spec_defaults() -> None:
    """size 100, fill_rate 50, wait 1 s, debt 10 s, max tokens = fill_rate, never idle."""
    spec = BucketSpec()
    assert (spec.size, spec.fill_rate, spec.wait_timeout_millis, spec.max_debt_millis) == (
        100,
        50.0,
        1000,
        10_000,
    )
    assert spec.max_tokens == 50.0
    assert spec.max_idle_millis == -1
    assert BucketSpec(fill_rate=3).max_tokens == 3


def test_lookup_order() -> None:
    """Named bucket, then the template's dynamic bucket, then the default, then the global."""
    quota = load_sources([("quota.yaml", QUOTA)]).quota
    assert quota is not None
    ref, spec = quota.lookup("pay", "card") or (None, None)
    assert ref is not None and (ref.namespace, ref.name, ref.dynamic) == ("pay", "card", False)
    assert spec is not None and spec.size == 10
    ref, spec = quota.lookup("pay", "anything") or (None, None)
    assert ref is not None and ref.dynamic and ref.max_dynamic_buckets == 5
    assert ref.name == "anything" and spec is not None and spec.fill_rate == 2.5
    ref, _ = quota.lookup("shop", "anything") or (None, None)
    assert ref is not None and (ref.namespace, ref.name) == ("shop", DEFAULT_BUCKET)
    ref, spec = quota.lookup("elsewhere", "x") or (None, None)
    assert ref is not None and (ref.namespace, ref.name) == (GLOBAL_NAMESPACE, DEFAULT_BUCKET)
    assert spec is not None and spec.size == 7
    nothing = load_sources([("q.yaml", "namespaces: {a: {buckets: {b: {}}}}")]).quota
    assert nothing is not None
    assert nothing.lookup("a", "c") is None
    assert nothing.lookup("b", "b") is None


BAD = [
    (
        "namespaces:\n  a:\n    default_bucket: {}\n    dynamic_bucket_template: {}\n",
        4,
        "namespaces.a.dynamic_bucket_template",
        "not both",
    ),
    (
        "namespaces:\n  a:\n    buckets:\n      b: {size: 1, fil_rate: 2}\n",
        4,
        "namespaces.a.buckets.b.fil_rate",
        "unknown key 'fil_rate'",
    ),
    ("namespaces:\n  a:\n    bukets: {}\n", 3, "namespaces.a.bukets", "unknown key"),
    ("global_default_bucket: {size: -1}\n", 1, "global_default_bucket.size", "out of range"),
    (
        "global_default_bucket: {fill_rate: -0.5}\n",
        1,
        "global_default_bucket.fill_rate",
        "out of range",
    ),
    (
        "namespaces:\n  a:\n    dynamic_bucket_template: {max_idle_millis: -2}\n",
        3,
        "namespaces.a.dynamic_bucket_template.max_idle_millis",
        "out of range",
    ),
    ("namespaces:\n  a:\n    max_dynamic_buckets: -1\n", 3, "namespaces.a.max_dynamic_buckets", ""),
    ("namespaces:\n  a-b: {}\n", 2, "namespaces.a-b", "[a-zA-Z0-9_]+"),
    ("namespaces:\n  a:\n    buckets:\n      b.c: {}\n", 4, "namespaces.a.buckets.b.c", "match"),
    ("namespaces: {}\nextra: 1\n", 2, "extra", "unknown key 'extra'"),
    ("global_default_bucket: {size: 1.5}\n", 1, "global_default_bucket.size", "whole number"),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), BAD)
def test_bad_quota_file_names_file_line_and_path(
    text: str, line: int, path: str, message: str
) -> None:
    """Each mistake is a ConfigError naming the file, the line and the YAML path."""
    with pytest.raises(ConfigError) as info:
        load_sources([("q.yaml", text)])
    problems = info.value.problems
    assert [(p.file, p.line, p.path) for p in problems] == [("q.yaml", line, path)]
    assert message in problems[0].message


def test_two_quota_files_are_an_error() -> None:
    """Buckets are defined in one file only; a second one is refused with both names."""
    with pytest.raises(ConfigError) as info:
        load_sources([("a.yaml", QUOTA), ("b.yaml", "namespaces: {}\n")])
    (problem,) = info.value.problems
    assert problem.file == "b.yaml" and "already defined in a.yaml" in problem.message


def test_ferryman_check_lists_buckets_and_reports_errors(tmp_path: Path) -> None:
    """`ferryman check` prints the buckets of a good directory and the errors of a bad one."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    good = tmp_path / "good"
    good.mkdir()
    (good / "quota.yaml").write_text(QUOTA)
    run = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(good)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "quota pay.card: size=10 fill_rate=10" in run.stdout
    assert "max_dynamic_buckets=5" in run.stdout
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "quota.yaml").write_text(BAD[0][0])
    run = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert f"{bad / 'quota.yaml'}:4:30: namespaces.a.dynamic_bucket_template:" in run.stdout
