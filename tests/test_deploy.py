"""deploy/: compose, Kubernetes, systemd, Consul and Docker files are valid and agree with `pubsubclub node`."""

from __future__ import annotations

import configparser
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from helpers.nodes import REPO

from pubsubclub.cli.command import parser
from pubsubclub.config import NodeConfig, build, load_toml, node_config
from pubsubclub.discovery.consul import ConsulDiscovery
from pubsubclub.testing import MemoryConsul

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "pubsubclub.service"
NODE_TOML = DEPLOY / "systemd" / "node.toml.example"
CONSUL_SERVICE = DEPLOY / "consul" / "pubsubclub-service.json"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_NODES = ("node1", "node2", "node3")


@functools.cache
def node_flags() -> frozenset[str]:
    """The long flags ``python -m pubsubclub node --help`` lists."""
    out = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "node", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    ).stdout
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))


def flags_in(argv: list[str]) -> set[str]:
    """The ``--flags`` of a command line (``--key=value`` counts as ``--key``)."""
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def assert_known_flags(argv: list[str], where: str) -> None:
    """Every flag in argv exists in ``pubsubclub node --help``."""
    unknown = flags_in(argv) - node_flags()
    assert not unknown, f"{where} uses flags that `pubsubclub node --help` does not list: {sorted(unknown)}"


def flag_values(argv: list[str], flag: str) -> list[str]:
    """The values given to ``flag`` (``--flag value`` or ``--flag=value``), in order."""
    values = []
    for i, a in enumerate(argv):
        if a == flag:
            values.append(argv[i + 1])
        elif a.startswith(flag + "="):
            values.append(a.split("=", 1)[1])
    return values


def flag_value(argv: list[str], flag: str) -> str:
    """The single value of ``flag``."""
    values = flag_values(argv, flag)
    assert len(values) == 1, f"expected exactly one {flag} in {argv}"
    return values[0]


def endpoint_port(endpoint: str) -> int:
    """The port of a Twisted ``tcp:``/``ssl:`` server endpoint string."""
    kind, port = endpoint.split(":")[:2]
    assert kind in ("tcp", "ssl"), endpoint
    return int(port)


def node_config_from(argv: list[str], tmp_path: Path) -> NodeConfig:
    """Run argv (``node ...``) through the real CLI parser and config build; files are swapped for temp files."""
    argv = list(argv)
    for flag in ("--cluster-secret-file", "--ca-file"):
        for i, a in enumerate(argv[:-1]):
            if a == flag:
                stand_in = tmp_path / flag.strip("-")
                stand_in.write_text("0123456789abcdef" * 4 + "\n")  # a 32-byte hex secret
                argv[i + 1] = str(stand_in)
    args = parser().parse_args(argv)
    assert args.command == "node"
    return node_config(args)


# --- docker-compose ---------------------------------------------------------------------------------


def compose_config(**variables: str) -> dict[str, Any]:
    """``docker-compose config`` of deploy/docker-compose.yml, validated and interpolated with ``variables``."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed, so deploy/docker-compose.yml cannot be validated: "
            "run `make sysdeps` or `apt-get install -y docker-compose` (no Docker engine needed)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUBSUBCLUB_", "COMPOSE_", "DOCKER_"))}
    env.update(variables)
    done = subprocess.run(
        [exe, "-f", "docker-compose.yml", "config"], cwd=DEPLOY, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"docker-compose config rejected deploy/docker-compose.yml:\n{done.stderr}"
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def published_ports(service: dict[str, Any]) -> set[tuple[int, int]]:
    """(host, container) pairs of a service in ``docker-compose config`` output (long or short syntax)."""
    pairs = set()
    for p in service.get("ports", []):
        if isinstance(p, dict):
            pairs.add((int(p["published"]), int(p["target"])))
        else:
            host, container = str(p).rsplit(":", 2)[-2:]
            pairs.add((int(host), int(container)))
    return pairs


def test_compose_file_validates_with_consul_and_three_nodes(tmp_path: Path) -> None:
    """docker-compose config accepts the file: a Consul server and node1..3 wired to it, with healthchecks."""
    config = compose_config()
    services = config["services"]
    assert set(services) == {"consul", *COMPOSE_NODES}

    consul = services["consul"]
    assert consul["image"].startswith("hashicorp/consul:")
    consul_cmd = consul["command"] if isinstance(consul["command"], list) else shlex.split(consul["command"])
    assert {"agent", "-server", "-bootstrap-expect=1", "-client=0.0.0.0"} <= set(consul_cmd)
    assert consul["healthcheck"]["test"]

    assert "cluster_secret" in config["secrets"]
    secret_file = Path(config["secrets"]["cluster_secret"]["file"])
    assert secret_file.is_file(), f"secret file {secret_file} missing"
    build({}, {"cluster_secret_file": str(secret_file)})  # the node accepts the example secret

    wamp_host_ports = set()
    for name in COMPOSE_NODES:
        svc = services[name]
        where = f"docker-compose.yml service {name}"
        assert Path(svc["build"]["context"]).resolve() == REPO
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert svc["depends_on"]["consul"]["condition"] == "service_healthy"
        health = " ".join(svc["healthcheck"]["test"])
        assert "/health" in health, f"{where}: healthcheck does not probe /health"
        secrets = {s["source"] if isinstance(s, dict) else s for s in svc["secrets"]}
        assert "cluster_secret" in secrets

        cmd = svc["command"]
        assert cmd[0] == "node"
        assert_known_flags(cmd, where)
        assert flag_value(cmd, "--name") == name
        assert flag_value(cmd, "--consul") == "http://consul:8500"
        assert flag_value(cmd, "--advertise") == f"ws://{name}:{endpoint_port(flag_value(cmd, '--psc'))}/psc"
        assert flag_value(cmd, "--cluster-secret-file") == "/run/secrets/cluster_secret"
        assert str(endpoint_port(flag_value(cmd, "--http"))) in health, f"{where}: healthcheck port is not --http's"
        for flag in ("--wamp", "--psc", "--http"):
            assert "interface=0.0.0.0" in flag_value(cmd, flag), f"{where}: {flag} must bind 0.0.0.0 in a container"

        node_config_from(cmd, tmp_path)  # the command line builds a valid config
        (host_port, container_port) = published_ports(svc).pop()
        assert container_port == endpoint_port(flag_value(cmd, "--wamp"))
        wamp_host_ports.add(host_port)
    assert wamp_host_ports == {8080, 8081, 8082}


def test_compose_host_ports_move_with_environment_variables() -> None:
    """PUBSUBCLUB_NODE{1,2,3}_PORT and PUBSUBCLUB_CONSUL_PORT move the published host ports (8080-8082, 8500 taken)."""
    services = compose_config(
        PUBSUBCLUB_NODE1_PORT="18080",
        PUBSUBCLUB_NODE2_PORT="18081",
        PUBSUBCLUB_NODE3_PORT="18082",
        PUBSUBCLUB_CONSUL_PORT="18500",
    )["services"]
    assert published_ports(services["consul"]) == {(18500, 8500)}
    for i, name in enumerate(COMPOSE_NODES):
        assert published_ports(services[name]) == {(18080 + i, 8080)}
    comment = (DEPLOY / "docker-compose.yml").read_text()
    assert "PUBSUBCLUB_NODE1_PORT" in comment and "PUBSUBCLUB_CONSUL_PORT" in comment


def test_compose_comment_tells_how_the_container_user_reads_the_secret() -> None:
    """The compose file says the nodes run as uid 10001 (the Dockerfile's USER) and how to give them the secret."""
    user = dict(dockerfile_instructions())["USER"]
    uid = user.split(":")[0]
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert f"chown {uid}:{uid}" in text and "chmod 600" in text


# --- Kubernetes -------------------------------------------------------------------------------------


def k8s_objects() -> list[dict[str, Any]]:
    """Every document of every YAML file under deploy/kubernetes/."""
    files = sorted(K8S.glob("*.yaml"))
    assert files, "no Kubernetes manifests in deploy/kubernetes/"
    objects = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path.name}: not a Kubernetes object"
                objects.append(doc)
    return objects


def test_kubernetes_statefulset_matches_headless_service(tmp_path: Path) -> None:
    """The StatefulSet (3 replicas) is served by the headless Service; ports, probes, args and secret line up."""
    objects = k8s_objects()
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet"]
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    sts_name = sts["metadata"]["name"]
    assert sts_name == "pubsubclub"
    spec = sts["spec"]
    assert spec["replicas"] == 3

    headless = services[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None", "the StatefulSet's serviceName must be a headless Service"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert any(s["spec"].get("clusterIP") != "None" for s in services.values()), "no Service for WAMP clients"

    pod = spec["template"]
    pod_labels = pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    for svc in services.values():
        assert svc["spec"]["selector"].items() <= pod_labels.items(), (
            f"Service {svc['metadata']['name']} selects no pod"
        )
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 10

    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for svc in services.values():
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            known = target in ports if isinstance(target, str) else target in ports.values()
            assert known, f"Service {svc['metadata']['name']} port {sp['name']} targets no container port"
            assert ports[sp["name"]] == sp["port"], f"Service port {sp['name']} differs from the container's"

    args = container["args"]
    assert args[0] == "node"
    assert_known_flags(args, "deploy/kubernetes StatefulSet")
    assert ports["wamp"] == endpoint_port(flag_value(args, "--wamp"))
    assert ports["psc"] == endpoint_port(flag_value(args, "--psc"))
    assert ports["http"] == endpoint_port(flag_value(args, "--http"))
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health", f"{probe} must use /health"
        assert ports.get(get["port"], get["port"]) == ports["http"], f"{probe} must hit the --http port"

    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    used_vars = set(re.findall(r"\$\((\w+)\)", " ".join(args)))
    assert used_vars <= set(env), f"args use undefined variables: {sorted(used_vars - set(env))}"
    assert flag_value(args, "--name") == "$(POD_NAME)"
    advertise = flag_value(args, "--advertise")
    stable_name = f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local"
    assert advertise == f"ws://{stable_name}:{ports['psc']}/psc", "--advertise must be the pod's stable DNS name"
    # Static discovery: one --peer per replica, spelled exactly like that pod's --advertise (so it skips itself).
    expected_peers = [advertise.replace("$(POD_NAME)", f"{sts_name}-{i}") for i in range(spec["replicas"])]
    assert flag_values(args, "--peer") == expected_peers

    secret_file = flag_value(args, "--cluster-secret-file")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = [m for m in container["volumeMounts"] if "secret" in volumes[m["name"]]]
    assert any(secret_file.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts), (
        "--cluster-secret-file is not on a mounted Secret volume"
    )

    concrete = [a.replace("$(POD_NAME)", f"{sts_name}-0").replace("$(POD_NAMESPACE)", "default") for a in args]
    config = node_config_from(concrete, tmp_path)
    assert config.federation.advertise in config.federation.peers


# --- systemd ----------------------------------------------------------------------------------------


def read_unit() -> configparser.ConfigParser:
    """The unit file as INI (keys keep their case; repeated keys allowed, as systemd allows them)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit


def test_systemd_unit_runs_node_with_config(tmp_path: Path) -> None:
    """The unit has [Unit]/[Service]/[Install], runs `pubsubclub node --config` as a non-root user, hardened."""
    unit = read_unit()
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    svc = unit["Service"]
    assert svc["Type"] == "simple"
    assert svc["User"] not in ("", "root", "0")
    assert svc["Restart"] == "on-failure"
    assert svc["KillSignal"] == "SIGTERM"
    assert "TimeoutStopSec" in svc
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}.items():
        assert svc.get(key) == value, f"{key}={value} missing"
    assert unit["Install"]["WantedBy"] == "multi-user.target"

    argv = shlex.split(svc["ExecStart"])
    assert argv[0].startswith("/") and Path(argv[0]).name == "pubsubclub", "ExecStart needs the absolute path"
    assert argv[1] == "node"
    assert flag_value(argv, "--config") == "/etc/pubsubclub/node.toml"
    assert_known_flags(argv[1:], "deploy/systemd/pubsubclub.service")
    # The secret comes through LoadCredential: %d is the unit's credentials directory.
    cred_name = svc["LoadCredential"].split(":", 1)[0]
    assert flag_value(argv, "--cluster-secret-file") == f"%d/{cred_name}"

    runnable = [a.replace("/etc/pubsubclub/node.toml", str(NODE_TOML)) for a in argv[1:]]
    config = node_config_from(runnable, tmp_path)
    assert config.consul.url and config.federation.advertise and config.node.http


def test_systemd_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    """systemd-analyze verify reports no unknown or malformed directive in the unit."""
    exe = shutil.which("systemd-analyze")
    assert exe is not None, "systemd-analyze is missing: `make sysdeps` (Debian package systemd) installs it"
    installed = Path(sys.executable).with_name("pubsubclub")
    assert installed.is_file(), "the pubsubclub console script is not installed next to the test's Python"
    copy = tmp_path / UNIT.name
    copy.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={installed}", UNIT.read_text(), flags=re.M))
    done = subprocess.run([exe, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if f"{copy}:" in line]
    assert not problems, "systemd-analyze verify:\n" + "\n".join(problems)


def test_node_toml_example_loads_and_builds() -> None:
    """node.toml.example goes through load_toml + build: every key is known and every value valid."""
    values = load_toml(str(NODE_TOML))
    assert values.warnings == (), "the example uses deprecated flat keys"
    config = build(values, {})
    assert config.consul.url == "http://127.0.0.1:8500"
    assert config.federation.advertise and config.node.http and config.node.name
    assert endpoint_port(config.federation.listen or "") == urlsplit(config.federation.advertise).port


# --- Consul -----------------------------------------------------------------------------------------


def lower_keys(obj: Any) -> Any:
    """Consul config keys match case-insensitively, snake_case or CamelCase: normalise them."""
    if isinstance(obj, dict):
        return {k.lower().replace("_", ""): (v if k.lower() == "meta" else lower_keys(v)) for k, v in obj.items()}
    return obj


def test_consul_service_definition_has_required_fields() -> None:
    """The service definition parses and has Name, ID, Port, PSC meta and an HTTP /health check with Interval."""
    raw = json.loads(CONSUL_SERVICE.read_text())
    service = lower_keys(raw)["service"]
    assert service["name"] == NodeConfig().consul.service
    assert service["id"]
    assert isinstance(service["port"], int) and service["port"] == 9001
    meta = service["meta"]
    assert meta["psc_path"] == "/psc" and meta["psc_versions"]
    advertise = f"ws://{service['address']}:{service['port']}/psc"
    registered = ConsulDiscovery(
        None, node_id=service["id"], advertise_url=advertise, client=MemoryConsul().client()
    ).definition()["Meta"]
    assert set(meta) == set(registered), "meta keys differ from what a node registers"
    # A node reads the scheme from this meta: "wss" here makes peers dial wss://.
    entry = {"Node": {"Address": ""}, "Service": {**raw["service"], "ID": service["id"], "Port": service["port"]}}
    entry["Service"]["Meta"] = {**meta, "scheme": "wss"}
    entry["Service"]["Address"] = service["address"]
    assert ConsulDiscovery._member_url(entry)[1] == f"wss://{service['address']}:{service['port']}/psc"
    for key, value in meta.items():
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,128}", key) and isinstance(value, str) and len(value) <= 512
    check = service["check"]
    url = urlsplit(check["http"])
    assert url.path == "/health" and url.port == 8081
    assert url.hostname == service["address"]
    duration = r"\d+(ms|s|m|h)"
    assert re.fullmatch(duration, check["interval"]) and check["interval"] == "5s"
    assert re.fullmatch(duration, check["deregistercriticalserviceafter"])


# --- Dockerfile -------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    return instructions


def test_dockerfile_is_sane(tmp_path: Path) -> None:
    """python:3.11 base, non-root USER, HEALTHCHECK on /health of --http, ENTRYPOINT pubsubclub, CMD a valid node."""
    instructions = dockerfile_instructions()
    of = {}
    for word, rest in instructions:
        of.setdefault(word, []).append(rest)
    assert instructions[0][0] == "FROM" and of["FROM"][0].startswith("python:3.11")
    user = of["USER"][-1].split(":")[0]
    assert user not in ("root", "0")
    assert json.loads(of["ENTRYPOINT"][-1]) == ["pubsubclub"]

    cmd = json.loads(of["CMD"][-1])
    assert cmd[0] == "node"
    assert_known_flags(cmd, "deploy/Dockerfile CMD")
    config = node_config_from(cmd, tmp_path)
    ports = {endpoint_port(e) for e in (config.wamp.listen, config.federation.listen or "", config.node.http or "")}
    assert ports == {int(p) for p in " ".join(of["EXPOSE"]).split()} == {8080, 9001, 8081}

    (health,) = of["HEALTHCHECK"]
    assert "/health" in health and f":{endpoint_port(config.node.http or '')}/health" in health

    copied = {src for args in of["COPY"] for src in args.split()[:-1]}
    assert {"setup.cfg", "pyproject.toml", "README.md", "pubsubclub"} <= copied
    ignore = (REPO / ".dockerignore").read_text().split()
    if "*" in ignore:  # an allowlist: everything the Dockerfile copies must be let back in
        allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
        assert copied <= allowed, f".dockerignore hides {sorted(copied - allowed)} from the build"
