"""The baseline of ``sidebyside.py --baseline``: an exported revision's src/, and configs it accepts.

The revision is HEAD (any checkout has it), exported into a cache of the test's own; the configs are put to that
revision's real ``bastion check``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_export_puts_the_revisions_package_first_on_the_path(bench_modules: None, tmp_path: Path) -> None:
    from baseline import export

    baseline = export("HEAD", cache=tmp_path)
    assert baseline.root == tmp_path / f"baseline-{baseline.sha}"
    assert (baseline.src / "bastion" / "__init__.py").exists()
    assert not (baseline.root / "tests").exists()  # src/ only
    assert baseline.env()["PYTHONPATH"].split(":")[0] == str(baseline.src)
    assert baseline.short == baseline.sha[:7]
    marker = baseline.root / ".exported"
    stamp = marker.stat().st_mtime_ns
    again = export(baseline.sha, cache=tmp_path)  # the same commit, by another name: the export is reused
    assert again.root == baseline.root
    assert marker.stat().st_mtime_ns == stamp


def test_export_refuses_what_is_not_a_revision(bench_modules: None, tmp_path: Path) -> None:
    from baseline import export
    from loadgen import BenchError

    with pytest.raises(BenchError, match="rev-parse"):
        export("no-such-revision-anywhere", cache=tmp_path)


@pytest.mark.parametrize(("output", "found"), [
    ("error: c.yaml:9 [bogus]: unknown key 'bogus' (allowed: admin, audit)", ((), "bogus")),
    ("error: c.yaml:7 [pinning.foo]: unknown key 'foo'; expected one of enabled, file", (("pinning",), "foo")),
    ("error: c.yaml:2 [upstreams.up.zz]: unknown key 'zz'", (("upstreams", "up"), "zz")),
    ("error: c.yaml:4 [sanitize]: unknown key(s): extra, more", (("sanitize",), "extra")),
    ("error: c.yaml:4 [listen.port]: expected an integer", None),
])
def test_unknown_key_reads_both_spellings_of_the_error(bench_modules: None, output: str,
                                                       found: tuple[tuple[str, ...], str] | None) -> None:
    from baseline import unknown_key

    assert unknown_key(output) == found


def test_omit_leaves_the_input_alone(bench_modules: None) -> None:
    from baseline import omit
    from loadgen import BenchError

    doc = {"a": 1, "pinning": {"enabled": True, "new": 2}}
    assert omit(doc, ("pinning",), "new") == {"a": 1, "pinning": {"enabled": True}}
    assert omit(doc, (), "a") == {"pinning": {"enabled": True, "new": 2}}
    assert doc == {"a": 1, "pinning": {"enabled": True, "new": 2}}
    with pytest.raises(BenchError, match="not a mapping"):
        omit(doc, ("a",), "x")


def test_a_key_the_baseline_does_not_know_is_left_out_and_named(bench_modules: None, tmp_path: Path) -> None:
    from baseline import accepted_config, export
    from harness import ApiKey
    from sidebyside import bastion_config

    baseline = export("HEAD", cache=tmp_path / "cache")
    work = tmp_path / "work"
    work.mkdir()
    doc = bastion_config("bastion-off@head", port=1, upstream_url="http://127.0.0.1:2/mcp", work=work,
                         redis_url=None, key=ApiKey.new("bench"))
    # Stand-ins for keys a later revision added: one at the top, one inside a section.
    newer = {**doc, "bench_future_section": {"x": 1}, "pinning": {**doc["pinning"], "bench_future_key": True}}
    accepted, omitted = accepted_config(baseline, newer, work / "off.yaml")
    assert accepted == doc
    assert sorted(omitted) == ["bench_future_section", "pinning.bench_future_key"]
    assert "bench_future" not in (work / "off.yaml").read_text()


def test_the_benchmarks_own_configs_are_accepted_unchanged(bench_modules: None, tmp_path: Path) -> None:
    from baseline import accepted_config, export
    from harness import ApiKey
    from sidebyside import BASTION, bastion_config

    baseline = export("HEAD", cache=tmp_path / "cache")
    for name in BASTION:
        doc = bastion_config(f"{name}@head", port=1, upstream_url="http://127.0.0.1:2/mcp", work=tmp_path,
                             redis_url="redis://127.0.0.1:3/0", key=ApiKey.new("bench"))
        assert accepted_config(baseline, doc, tmp_path / f"{name}.yaml") == (doc, []), name


def test_a_config_refused_for_another_reason_stops_the_run(bench_modules: None, tmp_path: Path) -> None:
    from baseline import accepted_config, export
    from loadgen import BenchError

    baseline = export("HEAD", cache=tmp_path / "cache")
    with pytest.raises(BenchError, match=r"refuses bad\.yaml"):
        accepted_config(baseline, {"listen": {"port": "not a port"}, "upstreams": {}}, tmp_path / "bad.yaml")
