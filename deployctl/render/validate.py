"""Rendered files checked by the tools that read them: systemd-analyze, nginx -t, promtool, mtail,
kubernetes-validate.

Each check returns a ``ValidationResult``; a missing tool raises ``ToolMissing`` (exit 1) naming the package
to install. Nothing here prints.
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deployctl.errors import CheckFailed

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

# systemd-analyze messages that only say the release is not installed on this machine yet.
_NOT_INSTALLED = (re.compile(r"Command .+ is not executable: No such file or directory"),)
_K8S_VERSION = "1.30.0"  # oldest Kubernetes the manifests must work on (the preStop sleep action is 1.30)


class ToolMissing(CheckFailed):
    """A validation tool is not installed (exit 1)."""


@dataclass(frozen=True)
class ValidationResult:
    """One tool's verdict on one file: ``ok``, the tool's own output, and notes on what was adapted to check it."""

    tool: str
    path: str
    ok: bool
    output: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def _which(tool: str, package: str) -> str:
    path = shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/usr/bin/{tool}") if Path(p).exists()), None)
    if path is None:
        raise ToolMissing(f"{tool} is not installed, so rendered files cannot be validated",
                          fix=f"apt-get install -y {package} (tests/setup.sh installs it)")
    return path


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def verify_systemd(unit: Path) -> ValidationResult:
    """``systemd-analyze verify UNIT``. The one message that only means "this release is not installed here"
    (an Exec* executable missing) is noted, not failed; anything else (unknown keys, bad values) fails."""
    done = _run([_which("systemd-analyze", "systemd"), "verify", str(unit)])
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    expected = [line for line in lines if any(p.search(line) for p in _NOT_INSTALLED)]
    unexpected = [line for line in lines if line not in expected]
    return ValidationResult("systemd-analyze verify", str(unit), not unexpected, "\n".join(lines),
                            tuple(f"expected before install: {line}" for line in expected))


def nginx_test(prefix: Path | str, conf: Path | str) -> ValidationResult:
    """``nginx -t -p PREFIX -c CONF`` on files in place (the rollout runs this on the router before a reload)."""
    done = _run([_which("nginx", "nginx"), "-t", "-p", str(prefix), "-c", str(conf)])
    return ValidationResult("nginx -t", str(conf), done.returncode == 0, done.stderr.strip())


def _resolves(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def check_nginx_conf(cfg: DeployConfig, conf: Path) -> ValidationResult:
    """``nginx -t`` on a rendered router conf, included from a standalone main conf in a temp prefix.

    The access log is redirected into the prefix and upstream host names this machine cannot resolve are
    replaced by 127.0.0.1 (nginx resolves them at load); both are listed in ``notes``."""
    from deployctl.render.release import render_nginx_main

    text = conf.read_text()
    notes = []
    with tempfile.TemporaryDirectory(prefix="deployctl-nginx-") as tmp:
        for d in ("logs", "temp"):
            Path(tmp, d).mkdir()
        for m in re.finditer(r"^\s*access_log\s+(\S+)", text, re.M):
            text = text.replace(m.group(1), f"{tmp}/logs/access.json")
            notes.append(f"access_log {m.group(1)} checked as {tmp}/logs/access.json")
        for host in sorted({m.group(1) for m in re.finditer(r"^\s*server\s+(\S+):\d+", text, re.M)}):
            if not _resolves(host):
                text = re.sub(rf"(^\s*server\s+){re.escape(host)}:", r"\g<1>127.0.0.1:", text, flags=re.M)
                notes.append(f"upstream {host} does not resolve here; checked as 127.0.0.1")
        text = _stand_in_certificates(text, Path(tmp), notes)
        text = _stand_in_keys(cfg, text, Path(tmp), notes)
        Path(tmp, "router.conf").write_text(text)
        Path(tmp, "nginx.conf").write_text(render_nginx_main(cfg, prefix=tmp, include_path=f"{tmp}/router.conf"))
        result = nginx_test(tmp, f"{tmp}/nginx.conf")
    return ValidationResult("nginx -t", str(conf), result.ok, result.output, tuple(notes))


def _stand_in_keys(cfg: DeployConfig, text: str, tmp: Path, notes: list[str]) -> str:
    """The router's API keys file (on the router host only, never rendered here) replaced by one holding a made-up
    key, so nginx -t checks the maps and the key checks that use them."""
    from deployctl.render import keys

    for m in re.finditer(r"^include\s+(\S+\.keys);", text, re.M):
        base = cfg.service.name.replace("-", "_")
        stand_in = keys.KeysFile((keys.Key("deployctl-nginx-t-stand-in", "deploy", "-"),), "deployctl-nginx-t-stand-in")
        Path(tmp, "router.keys").write_text(keys.render(base, stand_in))
        text = text.replace(m.group(0), f"include {tmp}/router.keys;")
        notes.append(f"keys file {m.group(1)} checked as a stand-in with a made-up key")
    return text


def _stand_in_certificates(text: str, tmp: Path, notes: list[str]) -> str:
    """``text`` with ``ssl_certificate``/``ssl_certificate_key`` files that are not on this machine (they live on the
    router host) replaced by a throwaway self-signed pair in ``tmp``, so nginx -t checks everything else."""
    paths = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(ssl_certificate(?:_key)?)\s+(\S+);", text, re.M)}
    if not paths or all(Path(p).is_file() for p in paths.values()):
        return text
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deployctl nginx -t stand-in")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    stand_in = {"ssl_certificate": tmp / "stand-in.pem", "ssl_certificate_key": tmp / "stand-in.key"}
    stand_in["ssl_certificate"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    stand_in["ssl_certificate_key"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    for directive, path in paths.items():
        text = re.sub(rf"^(\s*{directive}\s+){re.escape(path)};", rf"\g<1>{stand_in[directive]};", text, flags=re.M)
        notes.append(f"{directive} {path} is on the router host; checked with a stand-in (preflight reads the real one)")
    return text


def check_alert_rules(path: Path) -> ValidationResult:
    """``promtool check rules FILE``."""
    done = _run([_which("promtool", "prometheus"), "check", "rules", str(path)])
    return ValidationResult("promtool check rules", str(path), done.returncode == 0,
                            (done.stdout + done.stderr).strip())


def run_rule_tests(test_file: Path) -> ValidationResult:
    """``promtool test rules FILE``: alert expressions evaluated against input series (unit tests for rules)."""
    done = _run([_which("promtool", "prometheus"), "test", "rules", str(test_file)])
    return ValidationResult("promtool test rules", str(test_file), done.returncode == 0,
                            (done.stdout + done.stderr).strip())


def check_dashboard(path: Path) -> ValidationResult:
    """Every PromQL expression of a Grafana dashboard JSON (render.dashboard) through ``promtool check rules``:
    each becomes a recording rule ``deployctl:panel_N`` in a scratch file, so Prometheus's own parser reads it;
    a failure names the panel and target."""
    import json

    import yaml

    from deployctl.render.dashboard import expressions

    exprs = expressions(json.loads(path.read_text()))
    rules = [{"record": f"deployctl:panel_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    with tempfile.TemporaryDirectory(prefix="deployctl-dashboard-") as tmp:
        scratch = Path(tmp) / "panels.rules.yaml"
        scratch.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
        done = _run([_which("promtool", "prometheus"), "check", "rules", str(scratch)])
    output = (done.stdout + done.stderr).strip()
    # promtool names each rule by its record name: name the panel and target instead
    output = re.sub(r"deployctl:panel_(\d+)\b", lambda m: repr(exprs[int(m.group(1))][0]), output)
    return ValidationResult("promtool check rules (dashboard PromQL)", str(path), done.returncode == 0, output,
                            (f"{len(exprs)} panel expressions",))


def check_dashboard_model(path: Path) -> ValidationResult:
    """The dashboard JSON read back through grafana-foundation-sdk's model (render.dashboard.model_differences):
    fails naming each key the model does not know and each value it reads otherwise (no type checks: the SDK's
    Python model reads values as they are)."""
    import json

    from deployctl.render.dashboard import model_differences

    try:
        problems = model_differences(json.loads(path.read_text()))
    except ValueError as err:
        problems = [f"not JSON: {err}"]
    return ValidationResult("grafana-foundation-sdk Dashboard model", str(path), not problems, "\n".join(problems))


def check_mtail_program(path: Path) -> ValidationResult:
    """``mtail --compile_only`` on the program's directory. Without mtail on this machine the program is noted
    as not compiled (it runs on the router host): ok, with a note naming the package."""
    mtail = shutil.which("mtail")
    if mtail is None:
        return ValidationResult("mtail --compile_only", str(path), True, "",
                                ("mtail is not installed here: the program was not compiled (apt-get install -y mtail)",))
    with tempfile.TemporaryDirectory(prefix="deployctl-mtail-") as tmp:
        shutil.copy(path, Path(tmp) / path.name)
        done = _run([mtail, "--compile_only", "--progs", tmp, "--logtostderr"])
    return ValidationResult("mtail --compile_only", str(path), done.returncode == 0,
                            (done.stdout + done.stderr).strip())


def check_k8s_manifest(path: Path, *, version: str = _K8S_VERSION) -> ValidationResult:
    """``check_k8s_manifests([path])`` for one file."""
    return check_k8s_manifests([path], version=version)[0]


def check_k8s_manifests(paths: list[Path], *, version: str = _K8S_VERSION) -> list[ValidationResult]:
    """One result per file of ``paths``; the custom resources of all of them go to node in one run. Schema check
    of every document: core objects with kubernetes-validate (offline, strict); custom
    resources (Argo Rollouts, Prometheus Operator, Gateway API) against their CRD schemas (render.crdvalidate,
    strict too). A Rollout's pod template is also checked as a Deployment's with kubernetes-validate, and its
    canary steps by shape. An InferencePool, which has no published schema, is checked against the fields of the
    extension's API reference (render.poolschema: the weaker check, noted); another custom kind fails."""
    import yaml

    from deployctl.render import crdvalidate

    try:
        import kubernetes_validate as kv
    except ImportError:
        raise ToolMissing("kubernetes-validate is not installed, so manifests cannot be validated",
                          fix="pip install kubernetes-validate") from None
    per_file = [_k8s_file(path, version, kv, crdvalidate, yaml) for path in paths]
    crds = [(i, doc) for i, (_, _, docs) in enumerate(per_file) for doc in docs]
    found = crdvalidate.check_documents([doc for _, doc in crds]) if crds else []
    for (i, doc), problems in zip(crds, found):
        per_file[i][0].extend(f"{doc['kind']} {p}" for p in problems)
    return [ValidationResult("kubernetes-validate + CRD schemas", str(path), not problems, "\n".join(problems),
                             tuple(notes)) for path, (problems, notes, _) in zip(paths, per_file)]


def _k8s_file(path: Path, version: str, kv, crdvalidate, yaml) -> tuple[list[str], list[str], list[dict]]:
    """(problems, notes, custom resources left for node) of one manifest file (check_k8s_manifests)."""
    problems, notes, crds = [], [], []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        kind = doc.get("kind")
        custom = crdvalidate.has_schema(doc)
        if custom:
            crds.append(doc)
            notes.append(f"{kind}: checked against the {doc['apiVersion']} CRD schema (@kubernetes-models)")
        if kind == "Rollout" and doc.get("apiVersion") == "argoproj.io/v1alpha1":
            spec = doc.get("spec", {})
            problems += _rollout_step_problems(spec.get("strategy", {}))
            doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": doc.get("metadata", {}),
                   "spec": {k: spec[k] for k in ("replicas", "revisionHistoryLimit", "selector", "template") if k in spec}}
            notes.append("Rollout: pod template checked against the apps/v1 Deployment schema, steps by shape")
        elif custom:
            continue
        elif kind == "InferencePool" and doc.get("apiVersion") == "inference.networking.k8s.io/v1":
            from deployctl.render.poolschema import pool_problems

            problems += [f"{kind} {p}" for p in pool_problems(doc)]
            notes.append("InferencePool: no published schema; checked against the fields of the extension's API "
                         "reference (render.poolschema, a weaker check)")
            continue
        elif "." in doc.get("apiVersion", "").split("/")[0]:
            problems.append(f"{kind} {doc.get('apiVersion')}: no schema to check it against")
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            path_str = ".".join(str(p) for p in exc.path)
            problems.append(f"{kind} {path_str}: {exc.message}")
        except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as exc:
            problems.append(f"{kind}: no schema in kubernetes-validate {version}: {exc}")
    return problems, notes, crds


def _rollout_step_problems(strategy: dict) -> list[str]:
    steps = (strategy.get("canary") or {}).get("steps")
    if not isinstance(steps, list) or not steps:
        return ["Rollout spec.strategy.canary.steps: missing or empty"]
    problems = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or len(step) != 1:
            problems.append(f"Rollout steps[{i}]: one key per step, got {step!r}")
        elif "setWeight" in step and not (isinstance(step["setWeight"], int) and 0 <= step["setWeight"] <= 100):
            problems.append(f"Rollout steps[{i}].setWeight: 0..100, got {step['setWeight']!r}")
        elif "pause" in step and not re.fullmatch(r"\d+[smh]?", str((step["pause"] or {}).get("duration", "0"))):
            problems.append(f"Rollout steps[{i}].pause.duration: like 300s, got {step['pause']!r}")
        elif not {"setWeight", "pause", "analysis"} & set(step):
            problems.append(f"Rollout steps[{i}]: unknown step {sorted(step)}")
    return problems


def check_compose(path: Path, ready_route: str = "/readyz") -> ValidationResult:
    """Parse compose.yaml and check what the runtime needs: GPU reservation (cuda), /readyz healthcheck,
    read-only weights mount, env_file. (No compose schema tool is installable here.)"""
    import yaml

    doc = yaml.safe_load(path.read_text())
    svc = (doc.get("services") or {}).get("runtime") or {}
    problems = []
    if ready_route not in " ".join(map(str, (svc.get("healthcheck") or {}).get("test", []))):
        problems.append(f"services.runtime.healthcheck.test does not probe {ready_route}")
    if not any(v.get("read_only") for v in svc.get("volumes", []) if isinstance(v, dict)):
        problems.append("services.runtime.volumes: the weights mount is not read_only")
    if svc.get("env_file") != ["runtime.env"]:
        problems.append("services.runtime.env_file is not [runtime.env]")
    return ValidationResult("compose parse", str(path), not problems, "\n".join(problems))


def validate_tree(cfg: DeployConfig, out_dir: Path) -> list[ValidationResult]:
    """Every check that applies to the files under ``out_dir`` (as written by render_all)."""
    results, manifests = [], []
    for path in sorted(out_dir.rglob("*")):
        if path.suffix in (".service", ".timer"):
            results.append(verify_systemd(path))
        elif path.parent.name == "router" and path.suffix == ".conf":
            results.append(check_nginx_conf(cfg, path))
        elif path.name == "alerts.rules.yaml":
            results.append(check_alert_rules(path))
        elif path.parent.name == "grafana" and path.suffix == ".json":
            results.append(check_dashboard(path))
            results.append(check_dashboard_model(path))
        elif path.suffix == ".mtail":
            results.append(check_mtail_program(path))
        elif path.parent.name == "k8s" and path.suffix == ".yaml":
            manifests.append((len(results), path))
            results.append(None)  # filled below, in this place: one node run for every file's custom resources
        elif path.name == "compose.yaml":
            from deployctl.engines import of

            results.append(check_compose(path, of(cfg).ready_route))
    if manifests:
        for (i, _), result in zip(manifests, check_k8s_manifests([p for _, p in manifests])):
            results[i] = result
    return results
