"""An earlier revision of bastion to measure beside the working tree: ``sidebyside.py --baseline REV``.

Only ``src/`` of the revision is exported (``git archive REV src``), into ``bench/.cache/baseline-<sha>/``, and
reused while it is there. Its gateways run on the same interpreter and virtualenv as the working tree's, with
``PYTHONPATH`` pointing at the exported tree: the dependencies are the ones installed now, so a baseline whose
dependencies differ is measured with today's (the header names both commits; the caller judges).

A config the benchmark writes today may hold a key the old revision does not know, and bastion refuses unknown
keys. Each baseline config is therefore put to the old revision's own ``bastion check`` first; a key it reports as
unknown is left out of the baseline's config, and reported, so that a table never hides that the two gateways
ran different configurations.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import write_config
from loadgen import REPO, BenchError
from peers import CACHE

# Both spellings bastion has used: "[pinning.foo]: unknown key 'foo'" (the path ends with the key) and
# "[sanitize]: unknown key(s): a, b" (the path is the parent's).
UNKNOWN_KEY = re.compile(r"\[(?P<path>[^\]]*)\]: unknown key(?:\(s\):)? (?P<keys>[^;(\n]+)")
MAX_OMISSIONS = 20  # bastion check reports one error per run; more new keys than this is not a baseline anymore


@dataclass(frozen=True)
class Baseline:
    """A revision's ``src/``, exported: ``root / "src" / "bastion"`` is that revision's package."""

    rev: str  # as given on the command line
    sha: str
    subject: str
    root: Path

    @property
    def short(self) -> str:
        return self.sha[:7]

    @property
    def src(self) -> Path:
        return self.root / "src"

    def env(self) -> dict[str, str]:
        """The environment of a baseline process: its ``src`` first on the path, ahead of the editable install."""
        path = os.pathsep.join(p for p in (str(self.src), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path}

    def describe(self) -> str:
        return f"{self.short} ({self.subject}), src/ exported to {self.root.relative_to(REPO)}/"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def export(rev: str, cache: Path = CACHE) -> Baseline:
    """``src/`` of ``rev``, exported once per commit and reused (a marker, written last, says it is complete)."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    subject = _git("log", "-1", "--format=%s", sha)
    root = cache / f"baseline-{sha}"
    marker = root / ".exported"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        print(f"exporting src/ of {sha[:7]} to {root}", file=sys.stderr, flush=True)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", 'git archive "$1" src | tar -x -C "$2"', "export",
                               sha, str(root)], cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchError(f"git archive {sha} src | tar -x -C {root}: {done.stderr.strip()}")
        marker.write_text(sha + "\n")
    baseline = Baseline(rev=rev, sha=sha, subject=subject, root=root)
    _check_import(baseline)
    return baseline


def _check_import(baseline: Baseline) -> None:
    """The editable install of the working tree must not win over ``PYTHONPATH``: check where bastion comes from."""
    done = subprocess.run([sys.executable, "-c", "import bastion; print(bastion.__file__)"], cwd=baseline.root,
                          env=baseline.env(), capture_output=True, text=True, check=False)
    found = Path(done.stdout.strip()) if done.returncode == 0 else None
    if found is None or not found.resolve().is_relative_to(baseline.src.resolve()):
        raise BenchError(f"baseline {baseline.short}: bastion imports from {found or done.stderr.strip()[-500:]}, "
                         f"not from {baseline.src}")


# -- configs the old revision accepts -----------------------------------------------------------------------------


def unknown_key(output: str) -> tuple[tuple[str, ...], str] | None:
    """The first unknown key ``bastion check`` reports: (the path of the mapping that holds it, the key)."""
    match = UNKNOWN_KEY.search(output)
    if match is None:
        return None
    path = tuple(p for p in match["path"].split(".") if p)
    key = match["keys"].split(",")[0].strip().strip("'\"")
    if path and path[-1] == key:
        path = path[:-1]
    return path, key


def omit(doc: Mapping[str, Any], path: Sequence[str], key: str) -> dict[str, Any]:
    """A copy of ``doc`` without ``key`` in the mapping at ``path``; the input is left as it was."""
    out = dict(doc)
    if not path:
        if key not in out:
            raise BenchError(f"cannot leave out {key!r}: the config has no such key")
        del out[key]
        return out
    head, *rest = path
    inner = out.get(head)
    if not isinstance(inner, Mapping):
        raise BenchError(f"cannot leave out {'.'.join([*path, key])}: {head!r} is not a mapping in the config")
    out[head] = omit(inner, rest, key)
    return out


def accepted_config(baseline: Baseline, doc: Mapping[str, Any], path: Path) -> tuple[dict[str, Any], list[str]]:
    """``doc`` less the keys ``baseline`` does not know, written to ``path``; and the dotted keys left out."""
    current, omitted = dict(doc), list[str]()
    for _ in range(MAX_OMISSIONS):
        write_config(path, current)
        done = subprocess.run([sys.executable, "-m", "bastion", "check", "--config", str(path)], cwd=baseline.root,
                              env=baseline.env(), capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return current, omitted
        output = done.stdout + done.stderr
        found = unknown_key(output)
        if found is None:
            raise BenchError(f"baseline {baseline.short} refuses {path.name}:\n{output[-2000:]}")
        where, key = found
        current = omit(current, where, key)
        omitted.append(".".join([*where, key]))
    raise BenchError(f"baseline {baseline.short}: more than {MAX_OMISSIONS} unknown keys in {path.name}")
