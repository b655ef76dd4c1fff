"""Custom resources checked against their projects' own schemas: Argo Rollouts (Rollout, AnalysisTemplate),
Prometheus Operator (PrometheusRule, PodMonitor, ServiceMonitor), Gateway API (HTTPRoute) and KEDA (ScaledObject), with the validators
the @kubernetes-models npm packages compile from each project's CRD OpenAPI schema, run by node (crdcheck.mjs).
A field the schema does not declare fails too (strict, as kubernetes-validate is for core objects).

The validators travel with deployctl: ``crdschemas/node_modules/`` beside this module holds the files of NPM_PACKAGES
(pinned; versions, licences and tarballs in ``crdschemas/SOURCES.json``) that crdcheck.mjs loads, copied by
tests/refresh_crd_schemas.py, so a pip install validates with node alone. ``$DEPLOYCTL_CRD_SCHEMAS`` (a folder
holding node_modules/) points at another copy. Raises ToolMissing (exit 1) without node or the packages.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from deployctl.errors import CheckFailed

# The npm packages and versions (tests/setup_test_venvs.sh installs these; tests/refresh_crd_schemas.py copies what
# the validators load into crdschemas/).
NPM_PACKAGES = ("@kubernetes-models/argo-rollouts@2.0.0", "@kubernetes-models/prometheus-operator@6.0.0",
                "@kubernetes-models/gateway-api@2.0.0", "@kubernetes-models/keda@2.0.0")
_ARGO = "@kubernetes-models/argo-rollouts/_schemas/ComGithubArgoprojArgoRolloutsPkgApisRolloutsV1alpha1"
_PROM = ("@kubernetes-models/prometheus-operator/_schemas/"
         "ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1")
_GW = "@kubernetes-models/gateway-api/_schemas/IoK8sSigsGatewayApiApisV1"
_KEDA = "@kubernetes-models/keda/_schemas/ComGithubKedacoreKedaV2ApisKedaV1alpha1"
SCHEMAS = {("argoproj.io/v1alpha1", "Rollout"): _ARGO + "Rollout.js",
           ("argoproj.io/v1alpha1", "AnalysisTemplate"): _ARGO + "AnalysisTemplate.js",
           ("monitoring.coreos.com/v1", "PrometheusRule"): _PROM + "PrometheusRule.js",
           ("monitoring.coreos.com/v1", "PodMonitor"): _PROM + "PodMonitor.js",
           ("monitoring.coreos.com/v1", "ServiceMonitor"): _PROM + "ServiceMonitor.js",
           ("gateway.networking.k8s.io/v1", "HTTPRoute"): _GW + "HTTPRoute.js",
           ("keda.sh/v1alpha1", "ScaledObject"): _KEDA + "ScaledObject.js"}


class ToolMissing(CheckFailed):
    """node or the schema packages are not installed (exit 1)."""


PACKAGED = Path(__file__).resolve().with_name("crdschemas")


def schemas_dir() -> Path:
    """The folder whose node_modules/ holds the schema packages: $DEPLOYCTL_CRD_SCHEMAS, else the copy shipped
    inside deployctl (PACKAGED)."""
    from deployctl import settings

    return settings.current().crd_schemas or PACKAGED


def has_schema(doc: dict) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in SCHEMAS


def check_documents(docs: list[dict], *, timeout: float = 60) -> list[list[str]]:
    """One list of problems per document of ``docs`` (each one with ``has_schema``), empty when it validates."""
    node = shutil.which("node")
    modules = schemas_dir() / "node_modules"
    if node is None:
        raise ToolMissing("node is not installed, so custom resources cannot be checked against their schemas",
                          fix="apt-get install -y nodejs npm (bash tests/setup_test_venvs.sh installs them)")
    missing = [p for p in NPM_PACKAGES if not (modules / p.rsplit("@", 1)[0] / "package.json").exists()]
    if missing:
        raise ToolMissing(f"{modules}: {', '.join(missing)} not installed, so custom resources cannot be checked",
                          fix=f"reinstall deployctl (its wheel ships them in {PACKAGED}), or point DEPLOYCTL_CRD_SCHEMAS at "
                              f"a folder where npm install --prefix DIR {' '.join(NPM_PACKAGES)} ran")
    items = [{"module": SCHEMAS[(d["apiVersion"], d["kind"])], "doc": d} for d in docs]
    done = subprocess.run([node, str(Path(__file__).with_name("crdcheck.mjs")), str(modules)],
                          input=json.dumps(items), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise CheckFailed(f"crdcheck.mjs failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


__all__ = ["NPM_PACKAGES", "PACKAGED", "SCHEMAS", "ToolMissing", "check_documents", "has_schema", "schemas_dir"]
