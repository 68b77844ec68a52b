"""The Kubernetes manifests in deploy/kubernetes parse, match the client's models and hold together."""

from __future__ import annotations

import os
import re
import shlex

import pytest
import yaml

from tests.deploy.manifests import (KUBERNETES, REPO, containers, deserialize, documents, model_of, pod_spec,
                                    unknown_fields)

DOCUMENTS = documents()
WORKLOADS = [d for d in DOCUMENTS if pod_spec(d.body) is not None]
#: Values for the $(VAR) references of container arguments (Kubernetes fills them from env).
SAMPLES = {"POD_IP": "10.0.0.7"}


def test_there_are_manifests_for_each_piece():
    kinds = {(d.path.relative_to(KUBERNETES).as_posix(), d.body["kind"]) for d in DOCUMENTS}
    assert ("daemonset.yaml", "DaemonSet") in kinds
    assert ("peer-service.yaml", "Service") in kinds
    assert ("fuse/mount-daemonset.yaml", "DaemonSet") in kinds
    assert ("fuse/training-pod.yaml", "Pod") in kinds
    assert ("replicate-indexed-job.yaml", "Job") in kinds


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_every_document_is_a_valid_object_of_its_model(document):
    body = document.body
    problems = list(unknown_fields(body, model_of(body).__name__, document.name))
    assert not problems, "\n".join(problems)
    obj = deserialize(body)  # the client's own checks: required fields, enum-like values
    assert obj.metadata.name == body["metadata"]["name"]


@pytest.mark.parametrize("document", WORKLOADS, ids=lambda d: d.name)
def test_every_mount_names_a_volume_and_every_probe_a_port(document):
    spec = pod_spec(document.body)
    volumes = {v["name"] for v in spec.get("volumes") or []}
    for container in containers(spec):
        ports = {p["name"] for p in container.get("ports") or []} | {p["containerPort"] for p in container.get("ports") or []}
        for mount in container.get("volumeMounts") or []:
            assert mount["name"] in volumes, f"{document.name} {container['name']}: no volume {mount['name']}"
            if mount.get("mountPropagation") == "Bidirectional":
                assert container.get("securityContext", {}).get("privileged"), "Bidirectional needs privileged"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in ports, f"{document.name}: {probe} on an unknown port"


def _one(path: str, kind: str):
    (found,) = [d.body for d in DOCUMENTS if d.path == KUBERNETES / path and d.body["kind"] == kind]
    return found


def test_the_daemonset_runs_serve_on_gpu_nodes_with_peers_probes_and_scrape_annotations():
    daemonset = _one("daemonset.yaml", "DaemonSet")
    template = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (daemon,) = spec["containers"]
    args = daemon["args"]
    assert args[0] == "serve" and "command" not in daemon  # the image's ENTRYPOINT is stager
    flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args[1:]}
    service = _one("peer-service.yaml", "Service")
    name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert flag["--peers"] == f"dns:{name}" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert flag["--peer-listen"].endswith(f":{ports['peer']}") and service["spec"]["ports"][0]["targetPort"] == "peer"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] == int(flag["--metrics-address"].rsplit(":", 1)[1])
    assert daemon["readinessProbe"]["httpGet"]["path"] == "/healthz" == daemon["livenessProbe"]["httpGet"]["path"]
    assert daemon["readinessProbe"]["httpGet"]["port"] == "peer"  # ready = listed in the headless Service
    assert daemon["resources"]["requests"] and daemon["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in daemon["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret_dir = flag["--peer-secret-file"].rsplit("/", 1)[0]
    assert volumes[mounts[secret_dir]]["secret"]["secretName"] == "stager-peer-secret"
    assert "hostPath" in volumes[mounts["/run/stager"]] and "hostPath" in volumes[mounts["/var/cache/stager"]]
    # SIGTERM drains (10 s), the daemon's watchdog ends it 20 s later at the latest.
    assert spec["terminationGracePeriodSeconds"] > 30


def test_the_config_the_daemonset_mounts_is_a_valid_stager_config():
    from stager.cli import cli
    from stager.cli.config_file import check_config
    import tomllib

    for document in DOCUMENTS:
        body = document.body
        for key, text in (body.get("data") or {}).items() | (body.get("stringData") or {}).items():
            if key.endswith(".toml"):
                checked = check_config(tomllib.loads(text), f"{document.name} {key}", cli.all_commands())
                assert checked.default_map


def test_training_pods_share_the_daemons_socket_and_cache_paths():
    daemon_spec = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in daemon_spec["volumes"] if "hostPath" in v}
    (daemon,) = daemon_spec["containers"]
    daemon_paths = {m["mountPath"]: host[m["name"]] for m in daemon["volumeMounts"] if m["name"] in host}
    for path in ("training-pod.yaml", "fuse/mount-daemonset.yaml"):
        body = next(d.body for d in DOCUMENTS if d.path == KUBERNETES / path)
        spec = pod_spec(body)
        their_host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        for container in spec["containers"]:
            mounts = {m["mountPath"]: their_host[m["name"]] for m in container["volumeMounts"] if m["name"] in their_host}
            # The same node directory at the same path: the daemon hands out paths of cache files.
            for inside in ("/run/stager", "/var/cache/stager"):
                assert mounts.get(inside) == daemon_paths[inside], f"{path}: {inside}"


def test_the_fuse_variant_propagates_the_mount_to_the_training_pod():
    mount_spec = _one("fuse/mount-daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    pod_spec_ = _one("fuse/training-pod.yaml", "Pod")["spec"]
    mounter = mount_spec["containers"][0]
    assert mounter["securityContext"]["privileged"] is True
    host = {v["name"]: v["hostPath"] for v in mount_spec["volumes"] if "hostPath" in v}
    assert any(h["path"] == "/dev/fuse" and h["type"] == "CharDevice" for h in host.values())
    (bidirectional,) = [m for m in mounter["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"]
    (reader,) = pod_spec_["containers"]
    (host_to_container,) = [m for m in reader["volumeMounts"] if m.get("mountPropagation") == "HostToContainer"]
    pod_host = {v["name"]: v["hostPath"]["path"] for v in pod_spec_["volumes"]}
    assert pod_host[host_to_container["name"]] == host[bidirectional["name"]]["path"]
    script = " ".join(mounter["args"])
    mountpoint = re.search(r"stager mount .* (\S+)$", script).group(1)
    assert mountpoint.startswith(bidirectional["mountPath"] + "/")
    assert "privileged" not in str(reader.get("securityContext", {}))


@pytest.mark.parametrize("kustomization", sorted(KUBERNETES.rglob("kustomization.yaml")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_kustomization_lists_files_that_exist(kustomization):
    body = yaml.safe_load(kustomization.read_text())
    assert body["kind"] == "Kustomization" and body["resources"]
    for resource in body["resources"]:
        target = kustomization.parent / resource
        assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{kustomization}: {resource}"


def test_the_check_finds_a_misspelt_field_a_wrong_type_and_a_missing_required_one():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i", "volumeMount": [], "ports": [{"containerPort": "80"}]}]}}
    problems = list(unknown_fields(pod, "V1Pod"))
    assert any(p.endswith(".volumeMount: not a field of V1Container") for p in problems), problems
    assert any("containerPort: expected int" in p for p in problems), problems
    with pytest.raises(ValueError, match="image|name"):
        deserialize({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{}]}})


def _stager_argv(container: dict) -> list[str] | None:
    """The arguments after `stager` of the command a container runs, if it runs stager."""
    command, args = list(container.get("command") or []), [str(a) for a in container.get("args") or []]
    if command in ([], ["stager"]):
        return args
    if command[:2] == ["sh", "-c"]:
        script = " ".join(command[2:] + args)
        found = re.search(r"\bexec stager (.*)$", script)
        return shlex.split(found.group(1)) if found else None
    return None


def test_every_stager_command_in_the_manifests_takes_its_values(monkeypatch):
    """The real CLI parses each container's arguments (Kubernetes' $(VAR) given a sample value)."""
    import click

    from stager.cli import cli

    for name in [k for k in os.environ if k.startswith("STAGER_")]:
        monkeypatch.delenv(name)
    commands = cli.all_commands()
    checked, problems = 0, []
    for document in WORKLOADS:
        for container in containers(pod_spec(document.body)):
            argv = _stager_argv(container)
            if not argv or argv[0] not in commands:
                continue
            argv = [re.sub(r"\$\((\w+)\)", lambda m: SAMPLES[m.group(1)], a) for a in argv]
            try:
                commands[argv[0]].make_context(argv[0], argv[1:])
            except click.ClickException as exc:
                problems.append(f"{document.name} container {container['name']}: stager {' '.join(argv)}: "
                                f"{exc.format_message()}")
            checked += 1
    assert checked >= 3 and not problems, "\n".join(problems)
