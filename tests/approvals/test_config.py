"""The ``approvals:`` config section: defaults, and precise errors for bad values."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.approvals import ApprovalsConfig
from bastion.errors import ConfigError


def test_defaults_and_overrides() -> None:
    assert ApprovalsConfig.from_mapping(None, "approvals") == ApprovalsConfig()
    cfg = ApprovalsConfig.from_mapping({"max_pending": 5, "max_pending_per_principal": 1,
                                        "admin_groups": ["sec", "sre"], "path": "/ops/approvals"}, "approvals")
    assert (cfg.max_pending, cfg.max_pending_per_principal, cfg.admin_groups, cfg.path) == \
        (5, 1, ("sec", "sre"), "/ops/approvals")


@pytest.mark.parametrize(("data", "path"), [
    ({"max_pending": 0}, "approvals.max_pending"),
    ({"max_pending_per_principal": True}, "approvals.max_pending_per_principal"),
    ({"admin_groups": []}, "approvals.admin_groups"),
    ({"path": "admin/"}, "approvals.path"),
    ({"nope": 1}, "approvals.nope"),
    ([1], "approvals"),
])
def test_bad_values_name_their_key(data: Any, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        ApprovalsConfig.from_mapping(data, "approvals")
    assert info.value.path == path
