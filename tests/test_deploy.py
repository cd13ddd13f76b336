"""The shipped container recipe and Kubernetes manifests agree with the router they run.

No container engine runs on these machines, so the image is not built here; what can drift is
held instead: the probe paths are the router's GET routes, the ports line up from the
container's flag to the Service and the ServiceMonitor, the config mount is where the command
reads its file, that file is a valid configuration, and the shutdown grace outlasts the
router's own.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from narwhal.cli import build_parser
from narwhal.core.config import parse_config
from narwhal.live.app import Router

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
# a wheel of the project's distribution, named as wheels are (PEP 427: runs of -_. become _)
_PROJECT = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
WHEEL = re.sub(r"[-_.]+", "_", _PROJECT["name"]) + "-*.whl"


def _manifests() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[doc["kind"]] = doc
    return found


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    found = _manifests()
    assert set(found) == {"ConfigMap", "Deployment", "Service", "ServiceMonitor"}
    return found


def _container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def _pod_labels(manifests: dict[str, dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    return labels


def _router(manifests: dict[str, dict[str, Any]]) -> Router:
    data = tomllib.loads(manifests["ConfigMap"]["data"]["narwhal.toml"])
    return Router(parse_config(data))


def test_the_configmap_is_a_valid_configuration(manifests: dict[str, dict[str, Any]]) -> None:
    router = _router(manifests)
    assert {e.role.value for e in router.config.engines} == {"prefill", "decode"}


def test_probes_are_the_routers_liveness_and_readiness_routes(
    manifests: dict[str, dict[str, Any]],
) -> None:
    container = _container(manifests)
    routes = _router(manifests).routes
    get_routes = {path for path, methods in routes.items() if "GET" in methods}
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"/livez", "/health", "/metrics"} <= get_routes


def test_ports_mount_and_grace_line_up(manifests: dict[str, dict[str, Any]]) -> None:
    container = _container(manifests)
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    args = build_parser().parse_args(["serve", *container["args"]])
    (port,) = container["ports"]
    assert port["containerPort"] == args.port
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
    (mount,) = container["volumeMounts"]
    assert Path(args.config).parent == Path(mount["mountPath"])
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["configMap"]["name"] == manifests["ConfigMap"]["metadata"]["name"]
    assert Path(args.config).name in manifests["ConfigMap"]["data"]
    assert pod["terminationGracePeriodSeconds"] > args.graceful_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert all(e["name"] != "NARWHAL_API_KEY" or "valueFrom" in e for e in container["env"])
    service, monitor = manifests["Service"], manifests["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= _pod_labels(manifests).items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"] and endpoint["path"] == "/metrics"
    watched = monitor["spec"]["selector"]["matchLabels"]
    assert watched.items() <= service["metadata"]["labels"].items()


def test_the_container_recipe_runs_what_the_deployment_runs(
    manifests: dict[str, dict[str, Any]],
) -> None:
    recipe = (DEPLOY / "Containerfile").read_text()
    instruction = {m[1]: m[2] for m in re.finditer(r"^([A-Z]+) (.+)$", recipe, re.MULTILINE)}
    assert json.loads(instruction["ENTRYPOINT"]) == ["narwhal", "serve"]
    assert json.loads(instruction["CMD"]) == _container(manifests)["args"]
    assert int(instruction["EXPOSE"]) == _container(manifests)["ports"][0]["containerPort"]
    run_as = manifests["Deployment"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert int(instruction["USER"]) == run_as
    assert "/livez" in instruction["HEALTHCHECK"]
    # the compiled wheel of scripts/build_wheel.sh, alone (without the sim extra)
    assert "RUN bash scripts/build_wheel.sh /wheels\n" in recipe
    assert f"pip install --no-cache-dir /wheels/{WHEEL} " in recipe


BUILD_WHEEL = DEPLOY.parent / "scripts" / "build_wheel.sh"


@pytest.mark.skipif(
    not BUILD_WHEEL.exists(), reason="tests copied without the checkout (the compiled build's run)"
)
def test_the_wheel_script_names_the_wheel_the_recipe_installs() -> None:
    assert f'ls "$OUT"/{WHEEL}' in BUILD_WHEEL.read_text()
