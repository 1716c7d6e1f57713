"""docker-compose.yml against the Compose Specification schema, and its wiring against the bastion config."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest

from bastion import settings as settings_mod
from tests.deploy.support import ROOT, load_json, yaml_documents

COMPOSE = ROOT / "docker-compose.yml"
CONFIG = ROOT / "deploy" / "compose" / "bastion.yaml"


def compose() -> dict[str, Any]:
    (doc,) = yaml_documents(COMPOSE)
    return doc


def validator() -> jsonschema.Draft201909Validator:
    schema = load_json("compose-spec.json")
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def duration_s(text: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def test_valid_against_the_compose_specification() -> None:
    errors = sorted(validator().iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


@pytest.mark.parametrize("mutate", [
    lambda d: d["services"]["bastion"].update(helthcheck={"test": ["CMD", "true"]}),
    lambda d: d["services"]["bastion"]["depends_on"]["redis"].update(condition="service_happy"),
    lambda d: d["services"]["redis"].update(ports="6379"),
])
def test_the_schema_rejects_broken_variants(mutate: Any) -> None:
    doc = copy.deepcopy(compose())
    mutate(doc)
    assert list(validator().iter_errors(doc))


def test_bastion_waits_for_healthy_dependencies() -> None:
    services = compose()["services"]
    deps = services["bastion"]["depends_on"]
    assert set(deps) == {"redis", "tools"}
    for name, dep in deps.items():
        assert dep == {"condition": "service_healthy"}
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert services["bastion"]["healthcheck"]["test"] == ["CMD", "python", "/opt/bastion/healthcheck.py"]


def test_mounts_config_and_policies_read_only() -> None:
    bastion = compose()["services"]["bastion"]
    binds = {}
    for volume in bastion["volumes"]:
        source, target, *mode = volume.split(":")
        binds[target] = (source, mode)
    config_target = bastion["command"][bastion["command"].index("--config") + 1]
    assert binds[config_target] == ("./deploy/compose/bastion.yaml", ["ro"])
    assert binds["/etc/bastion/policies"] == ("./examples/demo/policies", ["ro"])
    for source, _ in binds.values():
        if source.startswith("./"):
            assert (ROOT / source).exists(), source
    cfg = settings_mod.load(CONFIG, env={})
    assert [str(p) for p in cfg.policies] == ["/etc/bastion/policies"]


def test_hardened_and_graceful() -> None:
    bastion = compose()["services"]["bastion"]
    assert bastion["read_only"] is True
    assert "/tmp" in bastion["tmpfs"]
    assert bastion["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in bastion["security_opt"]
    grace = int(bastion["command"][bastion["command"].index("--grace") + 1])
    # Compose SIGKILLs after stop_grace_period; bastion must be done draining before that.
    assert grace < duration_s(bastion["stop_grace_period"])
    # Published on the host's loopback only: the demo key is public.
    assert all(p.startswith("127.0.0.1:") for p in bastion["ports"])


def test_only_bastion_is_published() -> None:
    services = compose()["services"]
    assert [name for name, svc in services.items() if "ports" in svc] == ["bastion"]


def test_config_points_at_the_compose_services() -> None:
    services = compose()["services"]
    cfg = settings_mod.load(CONFIG, env={})
    assert not cfg.listen.is_loopback  # so auth is mandatory, and it is configured
    assert cfg.raw["auth"] != "none"
    assert cfg.listen.port == int(services["bastion"]["ports"][0].rsplit(":", 1)[1])

    assert cfg.redis_url is not None
    redis_host = urlsplit(cfg.redis_url)
    assert redis_host.hostname == "redis"
    assert str(redis_host.port) in services["redis"]["expose"]

    upstreams = {u.name: u for u in cfg.upstreams}
    tools_url = urlsplit(upstreams["tools"].url or "")
    assert tools_url.hostname == "tools"
    tools_cmd = services["tools"]["command"]
    assert str(tools_url.port) == tools_cmd[tools_cmd.index("--port") + 1]
    assert tools_cmd[tools_cmd.index("--host") + 1] == "0.0.0.0"  # reachable from the bastion container

    # The stdio upstream runs the copy of the demo the Dockerfile puts in the image.
    script = upstreams["notes"].command[-1]
    assert script == "/opt/bastion/examples/demo/notes_server.py"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY examples/demo /opt/bastion/examples/demo" in dockerfile
    assert (ROOT / "examples" / "demo" / Path(script).name).exists()


def test_demo_key_in_the_docs_matches_the_hash_in_the_config() -> None:
    from bastion.auth.apikeys import hash_key

    docs = (ROOT / "docs" / "deploy.md").read_text()
    (key,) = set(re.findall(r"bst_demo-[A-Za-z0-9-]+", docs))
    cfg = settings_mod.load(CONFIG, env={})
    hashes = [entry["hash"] for entry in cfg.raw["auth"]["api_keys"]]
    assert hashes == [hash_key(key)]
