"""The compose overrides for Redis Sentinel and Redis Cluster: valid once merged onto docker-compose.yml, and the
URL they hand bastion names the services they define, in the shape bastion reads."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from bastion.redisconn import parse_target
from tests.deploy.support import ROOT
from tests.deploy.test_compose import compose, validator

OVERRIDES = {"sentinel": ROOT / "deploy" / "compose" / "redis-sentinel.yml",
             "cluster": ROOT / "deploy" / "compose" / "redis-cluster.yml"}


def merged(override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of an override file: mappings merge key by key, everything else replaces."""
    def merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
        return into

    return merge(copy.deepcopy(compose()), override)


@pytest.mark.parametrize("kind", sorted(OVERRIDES))
def test_override_is_valid_and_points_bastion_at_its_nodes(kind: str) -> None:
    override = yaml.safe_load(OVERRIDES[kind].read_text())
    doc = merged(override)
    errors = [e.message for e in validator().iter_errors(doc)]
    assert errors == []
    target = parse_target(doc["services"]["bastion"]["environment"]["BASTION_REDIS_URL"])
    assert target.kind == kind
    assert len(target.nodes) == 3
    for host, _port in target.nodes:
        assert host in doc["services"], host
    # bastion starts only once the nodes answer (sentinels healthy; the cluster created).
    waits = doc["services"]["bastion"]["depends_on"]
    assert all(cond["condition"] in ("service_healthy", "service_completed_successfully")
               for cond in waits.values())
