"""Checks shared by the Kubernetes manifests and the rendered Helm chart.

Shape comes from the vendored strict Kubernetes schemas; what a schema cannot say (selectors that select, names
that resolve, probes on the right paths, the hardening every container needs, bastion's config loading) is
checked here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema

from bastion import settings as settings_mod
from bastion.errors import Refused
from bastion.policy import load_policies
from bastion.server.checks import HostGuard
from tests.deploy.support import load_json

Doc = dict[str, Any]


def schema_errors(doc: Doc) -> list[str]:
    subset = load_json("kubernetes-subset.json")
    kind = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if kind not in subset["kinds"]:
        return [f"{kind}: no schema (not a kind the deployment files are expected to use)"]
    schema = {**subset["kinds"][kind], "$schema": subset["$schema"], "$defs": subset["$defs"]}
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{kind} {doc.get('metadata', {}).get('name')}: {list(e.absolute_path)}: {e.message}"
            for e in validator.iter_errors(doc)]


def by_kind(docs: Iterable[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def names(docs: Iterable[Doc], kind: str) -> set[str]:
    return {d["metadata"]["name"] for d in by_kind(docs, kind)}


def pod_specs(docs: Iterable[Doc]) -> list[tuple[Doc, Doc]]:
    return [(d, d["spec"]["template"]["spec"]) for d in by_kind(docs, "Deployment")]


def all_containers(pod: Doc) -> list[Doc]:
    return list(pod.get("initContainers", [])) + list(pod["containers"])


def selects(selector: Doc, labels: Doc) -> bool:
    wanted = selector.get("matchLabels", selector)
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def check_schemas(docs: list[Doc]) -> None:
    errors = [e for d in docs for e in schema_errors(d)]
    assert not errors, "\n".join(errors)


def check_metadata(docs: list[Doc]) -> None:
    seen = set()
    for d in docs:
        meta = d["metadata"]
        assert meta.get("name"), d
        assert meta.get("labels", {}).get("app.kubernetes.io/part-of"), f"{meta['name']}: no part-of label"
        key = (d["kind"], meta["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)


def check_workloads(docs: list[Doc]) -> None:
    for deployment, pod in pod_specs(docs):
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"], labels), f"{name}: selector does not match its pods"
        assert pod.get("automountServiceAccountToken") is False, name
        pod_sc = pod.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, name
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for c in all_containers(pod):
            where = f"{name}/{c['name']}"
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{where}: resource requests"
            assert {"cpu", "memory"} <= set(res.get("limits", {})), f"{where}: resource limits"
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
            assert sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type") == "RuntimeDefault"
            assert "livenessProbe" in c, f"{where}: no liveness probe"
            assert "readinessProbe" in c or c.get("restartPolicy") == "Always", f"{where}: no readiness probe"
            assert ":latest" not in c["image"], where
            # A read-only root needs somewhere to write temporary files.
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if c["name"] != "redis":
                assert "/tmp" in mounts, f"{where}: no writable /tmp"


def bastion_containers(docs: list[Doc]) -> list[tuple[Doc, Doc, Doc]]:
    return [(deployment, pod, c) for deployment, pod in pod_specs(docs) for c in pod["containers"]
            if c.get("args", [None])[0] == "serve"]


def grace_of(container: Doc) -> int:
    args = container["args"]
    return int(args[args.index("--grace") + 1]) if "--grace" in args else 30


def check_bastion(docs: list[Doc]) -> None:
    found = bastion_containers(docs)
    assert found, "no bastion container"
    for deployment, pod, c in found:
        where = deployment["metadata"]["name"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", where
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", where
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in ports, f"{where}: {probe} port"
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        # Kubernetes SIGKILLs after terminationGracePeriodSeconds, counted from the start of preStop.
        assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace_of(c) + 5, where
        assert c["securityContext"].get("runAsUser", pod["securityContext"].get("runAsUser")) == 10001, where


def check_references(docs: list[Doc]) -> None:
    configmaps, secrets = names(docs, "ConfigMap"), names(docs, "Secret")
    secret_keys = {d["metadata"]["name"]: set(d.get("stringData", {})) | set(d.get("data", {}))
                   for d in by_kind(docs, "Secret")}
    for deployment, pod in pod_specs(docs):
        name = deployment["metadata"]["name"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, f"{name}: ConfigMap {v['configMap']['name']}"
            if "secret" in v:
                secret = v["secret"]["secretName"]
                assert secret in secrets, f"{name}: Secret {secret}"
                for item in v["secret"].get("items", []):
                    assert item["key"] in secret_keys[secret], f"{name}: {secret}/{item['key']}"
        for c in all_containers(pod):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{name}/{c['name']}: volume {m['name']}"
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secret_keys.get(ref["name"], set()), f"{name}: {ref}"
    pods = [(d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"])
            for d in by_kind(docs, "Deployment")]
    for svc in by_kind(docs, "Service"):
        matched = [p for labels, p in pods if selects(svc["spec"]["selector"], labels)]
        assert matched, f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:
            target = port["targetPort"]
            container_ports = {p.get("name") for pod in matched for c in all_containers(pod)
                               for p in c.get("ports", [])}
            assert not isinstance(target, str) or target in container_ports, f"{svc['metadata']['name']}: {target}"
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for obj in by_kind(docs, kind):
            selector = obj["spec"]["selector" if kind == "PodDisruptionBudget" else "podSelector"]
            assert any(selects(selector, labels) for labels, _ in pods), f"{kind} {obj['metadata']['name']}"
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        target = next(d for d in by_kind(docs, "Deployment")
                      if selects(pdb["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]))
        if "minAvailable" in pdb["spec"]:
            # Otherwise no node could ever be drained.
            assert pdb["spec"]["minAvailable"] < target["spec"]["replicas"], pdb["metadata"]["name"]


def check_scaling_and_monitoring(docs: list[Doc]) -> None:
    """What the HPA and ServiceMonitor schemas cannot say: what they point at exists and can work."""
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        target = next((d for d in docs if d["kind"] == ref["kind"] and d["metadata"]["name"] == ref["name"]), None)
        assert target is not None, f"HPA {hpa['metadata']['name']} targets nothing"
        assert ref["apiVersion"] == target["apiVersion"], hpa["metadata"]["name"]
        # A replicas field in the manifest would reset the HPA's count at every apply.
        assert "replicas" not in target["spec"], f"{ref['name']}: replicas set while an HPA owns the count"
        assert 1 <= hpa["spec"].get("minReplicas", 1) <= hpa["spec"]["maxReplicas"], hpa["metadata"]["name"]
        pods = target["spec"]["template"]["spec"]
        for metric in hpa["spec"].get("metrics", []):
            if metric["type"] == "Resource" and metric["resource"]["target"]["type"] == "Utilization":
                # Utilization is a share of the request: without one the HPA cannot compute it.
                resource = metric["resource"]["name"]
                for container in pods["containers"]:
                    assert resource in container.get("resources", {}).get("requests", {}), container["name"]
    services = by_kind(docs, "Service")
    for monitor in by_kind(docs, "ServiceMonitor"):
        selected = [svc for svc in services if selects(monitor["spec"]["selector"], svc["metadata"]["labels"])]
        assert selected, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"].get("endpoints", []):
            assert all(endpoint["port"] in {p.get("name") for p in svc["spec"]["ports"]} for svc in selected), \
                f"ServiceMonitor {monitor['metadata']['name']}: no Service port named {endpoint['port']}"
            assert endpoint.get("path", "/metrics") == "/metrics"


def materialize(docs: list[Doc], root: Path) -> Path:
    """Write each bastion container's ConfigMap and Secret volumes under ``root`` as the kubelet would mount them,
    and return the config file's path, with the mount paths inside it rewritten to point under ``root``."""
    _, pod, container = bastion_containers(docs)[0]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        v = volumes[mount["name"]]
        if "configMap" in v:
            files = dict(by_name[("ConfigMap", v["configMap"]["name"])]["data"])
        elif "secret" in v:
            files = dict(by_name[("Secret", v["secret"]["secretName"])]["stringData"])
            items = v["secret"].get("items")
            if items:
                files = {i["path"]: files[i["key"]] for i in items}
        else:
            continue
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for file_name, text in files.items():
            (target / file_name).write_text(text)
    args = container["args"]
    config = root / args[args.index("--config") + 1].lstrip("/")
    config.write_text(re.sub(r"(?<![\w/])/etc/bastion/", str(root / "etc" / "bastion") + "/", config.read_text()))
    return config


def check_bastion_config(docs: list[Doc], root: Path) -> settings_mod.Settings:
    config = materialize(docs, root)
    cfg = settings_mod.load(config, env={})
    assert cfg.policies, "a deployed gateway should always run with policies"
    load_policies(list(cfg.policies))
    return cfg


# What a kubelet HTTP probe sends as Host: the pod's IP (either family) and the probe's port.
POD_IPS = ("10.244.1.7", "[fd00:10:244::7]")


def check_probes_pass_the_host_check(docs: list[Doc], cfg: settings_mod.Settings) -> None:
    """Every HTTP probe of a bastion container passes the listener's Host check (which runs for every path): a
    kubelet probe's Host is ``<pod IP>:<port>`` unless the probe sets one, and a loopback listener answers only to
    loopback names, so a probe would get 421 and the pod would never be ready."""
    guard = HostGuard(cfg.listen)
    for deployment, _, c in bastion_containers(docs):
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(kind, {}).get("httpGet")
            if probe is None:
                continue
            port = ports.get(probe["port"], probe["port"])
            given = [h["value"] for h in probe.get("httpHeaders", []) if h["name"].lower() == "host"]
            for host in given or [f"{ip}:{port}" for ip in POD_IPS]:
                try:
                    guard({"type": "http", "path": probe["path"], "headers": [(b"host", host.encode())]})
                except Refused as exc:
                    raise AssertionError(f"{deployment['metadata']['name']}: {kind} with Host {host} gets "
                                         f"{exc.status}") from exc


def check_all(docs: list[Doc], root: Path) -> settings_mod.Settings:
    check_schemas(docs)
    check_metadata(docs)
    check_workloads(docs)
    check_bastion(docs)
    check_references(docs)
    check_scaling_and_monitoring(docs)
    cfg = check_bastion_config(docs, root)
    check_probes_pass_the_host_check(docs, cfg)
    return cfg
