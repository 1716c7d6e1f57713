"""Hot reload: good edits swap in, broken edits keep the last good set and say so, fixes recover."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from structlog.testing import capture_logs

from bastion.policy.decide import PolicySet
from bastion.policy.load import load_policies
from bastion.policy.watch import PolicyWatcher

GOOD = "version: 1\nrules:\n  - id: {rid}\n    effect: allow\n"
BROKEN = "version: 1\nrules:\n  - id: x\n    effect: allow\n    toolz: [a]\n"


def write(path: Path, text: str) -> None:
    path.write_text(text)


def test_good_reload_broken_edit_keeps_last_good_and_fix_recovers(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", GOOD.format(rid="first"))
    initial = load_policies([tmp_path])
    seen: list[PolicySet] = []
    watcher = PolicyWatcher([tmp_path], seen.append, initial=initial)
    assert watcher.status["ok"] is True
    assert watcher.status["version"] == initial.version
    assert watcher.reload_now() is False  # nothing changed

    write(tmp_path / "p.yaml", GOOD.format(rid="second"))
    assert watcher.reload_now() is True
    assert [r.id for r in seen[-1].rules] == ["second"]
    good_version = seen[-1].version
    assert watcher.status == {"ok": True, "version": good_version, "loaded_at": watcher.status["loaded_at"],
                              "error": None, "files": [str(tmp_path / "p.yaml")]}

    with capture_logs() as logs:
        write(tmp_path / "p.yaml", BROKEN)
        assert watcher.reload_now() is False
        assert watcher.reload_now() is False  # same broken content: reported once
    failures = [e for e in logs if e["event"] == "policy.reload_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"
    assert "p.yaml:5 [rules[0].toolz]: unknown key 'toolz'" in failures[0]["error"]
    assert failures[0]["keeping_version"] == good_version
    status = watcher.status
    assert status["ok"] is False
    assert status["version"] == good_version
    assert "unknown key 'toolz'" in status["error"]
    assert watcher.policy is seen[-1]
    assert len(seen) == 1

    write(tmp_path / "p.yaml", GOOD.format(rid="third"))
    assert watcher.reload_now() is True
    assert [r.id for r in seen[-1].rules] == ["third"]
    assert watcher.status["ok"] is True
    assert watcher.status["error"] is None


def test_undoing_a_broken_edit_clears_the_error_without_a_swap(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", GOOD.format(rid="same"))
    seen: list[PolicySet] = []
    watcher = PolicyWatcher([tmp_path], seen.append, initial=load_policies([tmp_path]))
    write(tmp_path / "p.yaml", BROKEN)
    watcher.reload_now()
    assert watcher.status["ok"] is False
    write(tmp_path / "p.yaml", GOOD.format(rid="same"))
    assert watcher.reload_now() is False
    assert watcher.status["ok"] is True
    assert seen == []


def test_removing_every_file_keeps_the_last_good_set(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", GOOD.format(rid="a"))
    watcher = PolicyWatcher([tmp_path], lambda _: None, initial=load_policies([tmp_path]))
    (tmp_path / "p.yaml").unlink()
    assert watcher.reload_now() is False
    assert watcher.status["ok"] is False
    assert "no policy files" in watcher.status["error"]
    assert watcher.policy is not None
    assert [r.id for r in watcher.policy.rules] == ["a"]


def test_kubernetes_configmap_symlink_swap_is_seen(tmp_path: Path) -> None:
    # The layout kubelet writes: name.yaml -> ..data/name.yaml, ..data -> ..<timestamp>/, swapped atomically.
    mount = tmp_path / "policies"
    mount.mkdir()
    (mount / "..v1").mkdir()
    write(mount / "..v1" / "p.yaml", GOOD.format(rid="v1"))
    os.symlink("..v1", mount / "..data")
    os.symlink("..data/p.yaml", mount / "p.yaml")
    watcher = PolicyWatcher([mount], lambda _: None, initial=load_policies([mount]))
    (mount / "..v2").mkdir()
    write(mount / "..v2" / "p.yaml", GOOD.format(rid="v2"))
    os.symlink("..v2", mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    assert watcher.reload_now() is True
    assert watcher.policy is not None
    assert [r.id for r in watcher.policy.rules] == ["v2"]


async def test_run_polls_and_reports_in_the_event_loop(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", GOOD.format(rid="start"))
    seen: list[PolicySet] = []
    changed = asyncio.Event()

    def on_reload(policy: PolicySet) -> None:
        asyncio.get_running_loop()  # raises if called outside the loop's thread
        seen.append(policy)
        changed.set()

    watcher = PolicyWatcher([tmp_path], on_reload, interval=0.02)  # no initial: the first poll loads
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(changed.wait(), timeout=30)
        assert [r.id for r in seen[0].rules] == ["start"]
        changed.clear()
        write(tmp_path / "p.yaml", GOOD.format(rid="changed-and-longer"))
        await asyncio.wait_for(changed.wait(), timeout=30)
        assert [r.id for r in seen[-1].rules] == ["changed-and-longer"]
    finally:
        task.cancel()
