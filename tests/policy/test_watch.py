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


# -- A poll sees the files at one instant; files change over many. Only a state two polls agree on counts. ------

ALLOW = "version: 1\nrules:\n  - id: allow-all\n    effect: allow\n"
DENY = "version: 1\nrules:\n  - id: no-echo\n    effect: deny\n    tools: [basic__echo]\n"


class Reports:
    """Everything a watcher reports, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def watcher(self, paths: list[Path], initial: PolicySet | None) -> PolicyWatcher:
        return PolicyWatcher(paths, lambda p: self.events.append(("reload", [r.id for r in p.rules])),
                             initial=initial, on_failure=lambda e: self.events.append(("failure", e)),
                             on_recovered=lambda p: self.events.append(("recovered", p.version)))


def _two_files(tmp_path: Path) -> PolicySet:
    write(tmp_path / "10-allow.yaml", ALLOW)
    write(tmp_path / "20-deny.yaml", DENY)
    return load_policies([tmp_path])


def _run_polls(watcher: PolicyWatcher, count: int) -> None:
    for _ in range(count):
        watcher.report(watcher.poll())


def test_an_editor_save_that_moves_the_file_aside_never_applies_the_set_without_it(tmp_path: Path) -> None:
    # vim's default save, and many tools': rename the old file, write the new one. A poll between the two saw a
    # valid set without the deny rule, and the gateway enforced it until the next poll.
    reports = Reports()
    initial = _two_files(tmp_path)
    watcher = reports.watcher([tmp_path], initial)
    os.replace(tmp_path / "20-deny.yaml", tmp_path / "20-deny.yaml~")
    _run_polls(watcher, 1)
    assert watcher.policy is initial
    write(tmp_path / "20-deny.yaml", DENY)
    (tmp_path / "20-deny.yaml~").unlink()
    _run_polls(watcher, 3)
    assert watcher.policy is initial
    assert reports.events == []
    assert watcher.status["ok"] is True


def test_a_file_read_half_written_is_never_applied(tmp_path: Path) -> None:
    reports = Reports()
    watcher = reports.watcher([tmp_path], _two_files(tmp_path))
    new = DENY + "  - id: no-add\n    effect: deny\n    tools: [basic__add]\n"
    with (tmp_path / "20-deny.yaml").open("w") as f:  # in place, as `cat > file` or an upload writes it
        f.write("version: 1\n")  # what a reader finds after the first write: valid, and no deny rule at all
        f.flush()
        _run_polls(watcher, 1)
        f.seek(0)
        f.truncate()
        f.write(new)
        assert watcher.policy is not None and [r.id for r in watcher.policy.rules] == ["allow-all", "no-echo"]
    _run_polls(watcher, 2)
    assert reports.events == [("reload", ["allow-all", "no-echo", "no-add"])]


def test_a_change_is_applied_once_two_polls_find_it(tmp_path: Path) -> None:
    reports = Reports()
    initial = _two_files(tmp_path)
    watcher = reports.watcher([tmp_path], initial)
    write(tmp_path / "10-allow.yaml", ALLOW.replace("allow-all", "allow-everything"))
    _run_polls(watcher, 1)
    assert watcher.policy is initial and reports.events == []
    _run_polls(watcher, 1)
    assert reports.events == [("reload", ["allow-everything", "no-echo"])]
    _run_polls(watcher, 3)
    assert len(reports.events) == 1


def test_a_broken_edit_is_reported_once_it_stays_and_its_end_is_reported(tmp_path: Path) -> None:
    reports = Reports()
    initial = _two_files(tmp_path)
    watcher = reports.watcher([tmp_path], initial)
    write(tmp_path / "20-deny.yaml", BROKEN)
    _run_polls(watcher, 1)
    assert reports.events == [] and watcher.status["ok"] is True
    _run_polls(watcher, 3)
    assert [kind for kind, _ in reports.events] == ["failure"]
    assert watcher.status["ok"] is False
    write(tmp_path / "20-deny.yaml", DENY)
    _run_polls(watcher, 3)
    assert reports.events[1:] == [("recovered", initial.version)]
    assert watcher.status["ok"] is True and watcher.policy is initial


def test_files_that_could_not_be_read_for_a_while_end_their_error_when_they_are_back(tmp_path: Path) -> None:
    # The directory moved away long enough to be reported, then back unchanged (same inodes, same times): the
    # error stayed in the status (/readyz `ok: false`) for good, since the content read matched the last one tried.
    policies = tmp_path / "policies"
    policies.mkdir()
    reports = Reports()
    initial = _two_files(policies)
    watcher = reports.watcher([policies], initial)
    _run_polls(watcher, 1)  # the watcher has stat'ed the files once
    os.replace(policies, tmp_path / "elsewhere")
    _run_polls(watcher, 2)
    assert [kind for kind, _ in reports.events] == ["failure"]
    assert "no such policy file or directory" in str(reports.events[0][1])
    assert watcher.status["ok"] is False
    os.replace(tmp_path / "elsewhere", policies)
    _run_polls(watcher, 2)
    assert reports.events[1:] == [("recovered", initial.version)]
    assert watcher.status == {"ok": True, "version": initial.version, "loaded_at": watcher.status["loaded_at"],
                              "error": None, "files": list(initial.files)}


def test_reload_now_decides_at_once_and_reports(tmp_path: Path) -> None:
    reports = Reports()
    watcher = reports.watcher([tmp_path], _two_files(tmp_path))
    write(tmp_path / "20-deny.yaml", BROKEN)
    assert watcher.reload_now() is False
    assert [kind for kind, _ in reports.events] == ["failure"]
    write(tmp_path / "20-deny.yaml", DENY.replace("no-echo", "no-echo-at-all"))
    assert watcher.reload_now() is True
    assert reports.events[-1] == ("reload", ["allow-all", "no-echo-at-all"])


async def test_request_reload_makes_the_running_watcher_decide_at_once(tmp_path: Path) -> None:
    # An hour between polls, and a change is decided on only at the second look: nothing but the request can
    # apply this edit while the test runs.
    applied = asyncio.Event()
    seen: list[PolicySet] = []

    def on_reload(policy: PolicySet) -> None:
        seen.append(policy)
        applied.set()

    watcher = PolicyWatcher([tmp_path], on_reload, interval=3600, initial=_two_files(tmp_path))
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0)
        write(tmp_path / "20-deny.yaml", DENY.replace("no-echo", "no-echo-now"))
        watcher.request_reload()
        async with asyncio.timeout(30):
            await applied.wait()
        assert [[r.id for r in p.rules] for p in seen] == [["allow-all", "no-echo-now"]]
    finally:
        task.cancel()
