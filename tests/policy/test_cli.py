"""The policy CLI as admins run it: real subprocesses, real files, exit codes and output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion.policy.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def test_check_accepts_the_shipped_examples() -> None:
    result = cli("check", "policies", "examples/demo/policies")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 5 file(s)")


def test_check_defaults_to_the_policies_directory() -> None:
    result = cli("check")
    assert result.returncode == 0, result.stderr
    assert "4 file(s)" in result.stdout


def test_check_reports_file_line_and_path(tmp_path: Path) -> None:
    bad = tmp_path / "dev.yaml"
    bad.write_text("version: 1\nrules:\n  - id: a\n    effect: allow\n    tools: [x]\n    tools: [y]\n")
    result = cli("check", str(bad))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (f"error: {bad}:6 [rules[0].tools]: duplicate key 'tools' (first at line 5)")


def test_explain_allowed_prints_rule_and_limits() -> None:
    result = cli("explain", "--policies", str(POLICIES), "--principal", "alice", "--group", "engineering",
                 "--tool", "files__read_file", "--args", '{"path": "/srv/projects/x/y.md"}')
    assert result.returncode == 0, result.stderr
    assert "decision:      allow" in result.stdout
    assert "rule:          eng-read-files" in result.stdout
    assert "limit:         eng-files 120/60s burst 30 per principal" in result.stdout
    assert "concurrency:   eng-files-inflight max 4 per principal" in result.stdout


def test_explain_denied_exits_1_and_names_the_rule() -> None:
    result = cli("explain", "--policies", str(POLICIES), "--principal", "ops", "--group", "platform-operators",
                 "--tool", "gh__delete_repo", "--upstream", "github", "--annotations", '{"destructiveHint": true}')
    assert result.returncode == 1
    assert "decision:      deny" in result.stdout
    assert "rule:          no-destructive-github" in result.stdout


def test_explain_json_with_claims_reports_shadow_denies() -> None:
    result = cli("explain", "--policies", str(POLICIES), "--principal", "carol",
                 "--claim", "employment_type=contractor", "--tool", "gh__get_issue", "--upstream", "github",
                 "--annotations", '{"readOnlyHint": true}', "--args", '{"project": "website"}', "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["decision"] == "allow"
    assert data["rule"] == "contractors-read-issues"
    assert data["shadow_denies"] == ["shadow-no-open-world-for-contractors"]


def test_explain_list_mode_and_default_deny() -> None:
    result = cli("explain", "--policies", str(POLICIES), "--principal", "mallory", "--tool", "files__read_file",
                 "--list")
    assert result.returncode == 1
    assert "(none: default deny)" in result.stdout


def test_explain_errors_exit_2() -> None:
    bad_json = cli("explain", "--policies", str(POLICIES), "--principal", "a", "--tool", "x__y", "--args", "{")
    assert bad_json.returncode == 2
    assert "--args is not valid JSON" in bad_json.stderr
    missing = cli("explain", "--policies", "/nonexistent", "--principal", "a", "--tool", "x__y")
    assert missing.returncode == 2
    assert "no such policy file" in missing.stderr
    usage = cli("explain", "--principal", "a")
    assert usage.returncode == 2


def test_shipped_cases_pass() -> None:
    result = cli("test", "policies/tests/cases.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("16 passed, 0 failed")


def test_failing_cases_are_listed_with_a_summary(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("version: 1\nrules:\n  - {id: eng, effect: allow, principals: {groups: [eng]}}\n"
                                     "  - {id: no-rm, effect: deny, tools: ['*__rm']}\n")
    (tmp_path / "cases.yaml").write_text("""\
policies: p.yaml
cases:
  - name: engineers allowed
    principal: {id: a, groups: [eng]}
    tool: fs__read
    expect: allow
    rule: eng
  - name: wrong expectation
    principal: {id: a, groups: [eng]}
    tool: fs__rm
    expect: allow
  - name: wrong rule
    principal: {id: b}
    tool: fs__read
    expect: deny
    rule: no-rm
  - name: prompt case
    principal: {id: a, groups: [eng]}
    prompt: fs__hello
    expect: allow
""")
    result = cli("test", str(tmp_path / "cases.yaml"))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert "FAIL wrong expectation" in lines
    assert "     expected allow, got deny: denied by rule 'no-rm' (" in result.stdout
    assert "FAIL wrong rule" in lines
    assert "     expected rule 'no-rm', got None" in lines
    assert "FAIL engineers allowed" not in lines
    assert lines[-1].startswith("2 passed, 2 failed")


def test_invalid_case_file_exits_2_with_location(tmp_path: Path) -> None:
    (tmp_path / "cases.yaml").write_text("policies: .\ncases:\n  - principal: {id: a}\n    expect: maybe\n")
    result = cli("test", str(tmp_path / "cases.yaml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'cases.yaml'}:4 [cases[0].expect]" in result.stderr


def test_explain_shows_a_tools_labels_and_decides_on_touched_labels() -> None:
    base = ("explain", "--policies", str(POLICIES), "--principal", "alice", "--group", "engineering",
            "--tool", "gh__create_issue", "--args", '{"project": "bastion", "title": "x"}')
    fresh = cli(*base)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "labels:        external_communication" in fresh.stdout
    touched = cli(*base, "--touched", "private_data", "--touched", "untrusted_content", "--json")
    assert touched.returncode == 1
    data = json.loads(touched.stdout)
    assert data["rule"] == "no-exfiltration-after-untrusted-input"
    assert data["labels"] == ["external_communication"]
    assert [t["label"] for t in data["flow"]] == ["private_data", "untrusted_content"]
    one = cli(*base, "--touched", "private_data")
    assert one.returncode == 0, one.stdout


def test_explain_resource_decides_and_shows_the_canonical_form(tmp_path: Path) -> None:
    rules = tmp_path / "p.yaml"
    rules.write_text('version: 1\nrules:\n  - {id: all, effect: allow}\n'
                     '  - {id: no-secrets, effect: deny, resources: ["files+file:///srv/secret/*"]}\n')
    result = cli("explain", "--policies", str(rules), "--principal", "alice", "--upstream", "files",
                 "--resource", "files+FILE://localhost/srv//%73ecret/key.pem", "--json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert (out["decision"], out["rule"], out["resource"]) == ("deny", "no-secrets",
                                                               "files+file:///srv/secret/key.pem")


def test_resource_cases_default_to_the_upstream_their_prefix_names(tmp_path: Path) -> None:
    # `upstreams:` meets a resource case as it meets the gateway's request for `files+file:///...`.
    (tmp_path / "p.yaml").write_text("version: 1\nrules:\n  - id: files-all\n    effect: allow\n"
                                     "    upstreams: [files]\n")
    (tmp_path / "cases.yaml").write_text(
        "policies: p.yaml\ncases:\n  - principal: {id: a}\n    resource: files+file:///srv/a.txt\n"
        "    expect: allow\n    rule: files-all\n")
    done = cli("test", str(tmp_path / "cases.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
