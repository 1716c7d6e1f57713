"""deploy/kubernetes: the standalone and sidecar manifests against Kubernetes schemas and structural rules."""

from __future__ import annotations

import copy
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.deploy import k8s
from tests.deploy.support import ROOT, yaml_documents

KUBE = ROOT / "deploy" / "kubernetes"


def manifests(flavour: str) -> list[k8s.Doc]:
    files = sorted((KUBE / flavour).glob("*.yaml"))
    assert files
    return [doc for f in files for doc in yaml_documents(f)]


@pytest.mark.parametrize("flavour", ["standalone", "sidecar"])
def test_manifests_pass_every_check(flavour: str, tmp_path: Path) -> None:
    k8s.check_all(manifests(flavour), tmp_path)


def test_standalone_scales_out_on_redis(tmp_path: Path) -> None:
    docs = manifests("standalone")
    ((deployment, _, container),) = k8s.bastion_containers(docs)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    env = {e["name"]: e for e in container["env"]}
    assert env["BASTION_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "bastion-secrets"
    cfg = k8s.check_bastion_config(docs, tmp_path)
    redis_host = urlsplit(cfg.redis_url or "").hostname
    assert redis_host in k8s.names(docs, "Service")
    for upstream in cfg.upstreams:
        assert urlsplit(upstream.url or "").hostname in k8s.names(docs, "Service")


def test_sidecar_upstream_is_reachable_only_through_bastion(tmp_path: Path) -> None:
    docs = manifests("sidecar")
    ((_, pod, _),) = k8s.bastion_containers(docs)
    (server,) = pod["initContainers"]
    assert server["restartPolicy"] == "Always"  # native sidecar: outlives bastion's drain
    args = server["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    port = int(args[args.index("--port") + 1])
    assert "ports" not in server  # nothing advertises it
    cfg = k8s.check_bastion_config(docs, tmp_path)
    (upstream,) = cfg.upstreams
    url = urlsplit(upstream.url or "")
    assert (url.hostname, url.port) == ("127.0.0.1", port)
    (policy,) = k8s.by_kind(docs, "NetworkPolicy")
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == ["http"]


def test_placeholder_keys_match_no_key(tmp_path: Path) -> None:
    for flavour in ("standalone", "sidecar"):
        secrets = k8s.by_kind(manifests(flavour), "Secret")
        text = "".join(s["stringData"].get("api-keys.yaml", "") for s in secrets)
        assert "sha256:" + "0" * 64 in text


@pytest.mark.parametrize(("path", "value"), [
    (["spec", "template", "spec", "containers", 0, "readinesProbe"], {}),
    (["spec", "replicas"], "three"),
    (["spec", "template", "spec", "containers", 0, "resources", "limits"], ["1"]),
])
def test_schema_check_catches_mistakes(path: list[object], value: object) -> None:
    deployment = copy.deepcopy(next(d for d in manifests("standalone") if d["metadata"]["name"] == "bastion"
                                    and d["kind"] == "Deployment"))
    node = deployment
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    assert k8s.schema_errors(deployment)


def test_structural_checks_catch_mistakes(tmp_path: Path) -> None:
    docs = copy.deepcopy(manifests("standalone"))
    ((_, pod, container),) = k8s.bastion_containers(docs)
    del container["resources"]["limits"]
    with pytest.raises(AssertionError, match="resource limits"):
        k8s.check_workloads(docs)

    docs = copy.deepcopy(manifests("standalone"))
    ((_, pod, _),) = k8s.bastion_containers(docs)
    pod["volumes"][0]["configMap"]["name"] = "bastion-confg"
    with pytest.raises(AssertionError, match="ConfigMap bastion-confg"):
        k8s.check_references(docs)

    docs = copy.deepcopy(manifests("standalone"))
    ((_, pod, _),) = k8s.bastion_containers(docs)
    pod["terminationGracePeriodSeconds"] = 30
    with pytest.raises(AssertionError):
        k8s.check_bastion(docs)


@pytest.mark.parametrize("flavour", ["standalone", "sidecar"])
def test_probes_pass_the_listeners_host_check_and_the_check_catches_a_loopback_listener(flavour: str,
                                                                                        tmp_path: Path) -> None:
    """The Host check runs for every path, /healthz and /readyz included: kubelet's ``Host: <pod IP>:<port>``
    must pass it. It does on the shipped listeners (0.0.0.0: a well-formed Host is enough); on a loopback one it
    would not, and the check says so."""
    docs = copy.deepcopy(manifests(flavour))
    cfg = k8s.check_bastion_config(docs, tmp_path / "shipped")
    k8s.check_probes_pass_the_host_check(docs, cfg)
    config = next(d for d in k8s.by_kind(docs, "ConfigMap") if "bastion.yaml" in d["data"])
    assert "host: 0.0.0.0" in config["data"]["bastion.yaml"]
    config["data"]["bastion.yaml"] = config["data"]["bastion.yaml"].replace("host: 0.0.0.0", "host: 127.0.0.1")
    cfg = k8s.check_bastion_config(docs, tmp_path / "loopback")
    with pytest.raises(AssertionError, match=r"Probe with Host 10\.244\.1\.7:8080 gets 421"):
        k8s.check_probes_pass_the_host_check(docs, cfg)
