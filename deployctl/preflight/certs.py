"""Preflight of the router's TLS certificate (``router.tls``): the PEM files are read on the router host over the
host layer and parsed here with ``cryptography``.

Checks (each a ``Check`` naming the file and the fix):
- ``tls_certificate``: the first certificate of ``router.tls.certificate`` (the leaf; nginx wants leaf first) is
  valid now and for at least CERT_FAIL_DAYS more days (fail), CERT_WARN_DAYS (warn) — deployctl.config.router.
- ``tls_key``: ``router.tls.key`` is an unencrypted private key whose public half is the certificate's.
- ``tls_name``: a DNS name in the certificate's subjectAltName covers ``router.server_name`` (RFC 6125 6.4: a
  ``*`` only as the whole left-most label, matching exactly one label; the subject CN is not used, as browsers and
  Python's ssl module do not use it).
- ``tls_served``: the leaf nginx serves now (a TLS handshake from the router host to ``router.listen`` with SNI
  ``router.server_name``) is the file's (same SHA-256 fingerprint); otherwise both are named by notAfter,
  fingerprint and SANs. A served leaf that has expired fails; a different one warns in preflight (a renewed file
  not yet reloaded: `deployctl router reload`) and fails after a reload (``after_reload``).

The private key is read into memory only to compare its public half; it is never written, logged or returned.
"""
from __future__ import annotations

import datetime as dt
from typing import Optional

from deployctl.config.router import CERT_FAIL_DAYS, CERT_WARN_DAYS
from deployctl.preflight.checks import Check

RENEW_FIX = ("renew it (e.g. `certbot renew`), then `deployctl router reload` (every deploy reloads nginx too)")


def _name_covers(pattern: str, name: str) -> bool:
    """Whether SAN ``pattern`` (maybe ``*.example.com``) covers ``name`` (RFC 6125 6.4.3, left-most label only)."""
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern == name:
        return True
    if not pattern.startswith("*.") or name.startswith("*."):
        return False
    head, _, rest = name.partition(".")
    return bool(head) and rest == pattern[2:]


def _load_leaf(cert_pem: bytes):
    from cryptography import x509

    certs = x509.load_pem_x509_certificates(cert_pem)
    return certs[0]


def expiry_check(cert, path: str, now: dt.datetime) -> Check:
    """``tls_certificate``: pass, warn under CERT_WARN_DAYS days left, fail under CERT_FAIL_DAYS, expired or not yet
    valid."""
    after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
    left_days = (after - now).total_seconds() / 86400
    until = f"{after:%Y-%m-%d %H:%M} UTC"
    if now < before:
        return Check("tls_certificate", "fail", f"{path} is not valid before {before:%Y-%m-%d %H:%M} UTC",
                     "check the router host's clock, or install a certificate valid now")
    if left_days <= 0:
        return Check("tls_certificate", "fail", f"{path} expired on {until}", RENEW_FIX)
    if left_days < CERT_FAIL_DAYS:
        return Check("tls_certificate", "fail", f"{path} expires in {left_days:.1f} days ({until}), under "
                     f"{CERT_FAIL_DAYS}", RENEW_FIX)
    if left_days < CERT_WARN_DAYS:
        return Check("tls_certificate", "warn", f"{path} expires in {left_days:.0f} days ({until}), under "
                     f"{CERT_WARN_DAYS}: automatic renewal has not run", RENEW_FIX)
    return Check("tls_certificate", "pass", f"{path} valid until {until} ({left_days:.0f} days)")


def key_check(cert, key_pem: Optional[bytes], cert_path: str, key_path: str, why: Optional[str] = None) -> Check:
    """``tls_key``: the private key loads without a password and matches the certificate's public key."""
    from cryptography.hazmat.primitives import serialization

    if key_pem is None:
        return Check("tls_key", "fail", why or f"{key_path} could not be read",
                     "check router.tls.key: the file must exist on the router host, readable by root or the SSH user")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        return Check("tls_key", "fail", f"{key_path} is encrypted; nginx cannot load it without a password",
                     f"decrypt it (openssl pkey -in {key_path} -out {key_path}) and keep it 0600")
    except ValueError:
        return Check("tls_key", "fail", f"{key_path} is not a PEM private key", "point router.tls.key at the "
                     "certificate's private key (-----BEGIN PRIVATE KEY-----)")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        return Check("tls_key", "fail", f"{key_path} does not match the certificate in {cert_path} (another key pair)",
                     "point router.tls.key at the key the certificate was issued for, or reissue the certificate")
    return Check("tls_key", "pass", f"{key_path} matches {cert_path}")


def name_check(cert, path: str, server_name: str) -> Check:
    """``tls_name``: a subjectAltName DNS entry covers ``server_name``."""
    from cryptography import x509

    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        sans = []
    if any(_name_covers(s, server_name) for s in sans):
        return Check("tls_name", "pass", f"{path} covers {server_name}")
    listed = ", ".join(sans) if sans else "no DNS names in subjectAltName"
    return Check("tls_name", "fail", f"{path} does not cover router.server_name {server_name} ({listed})",
                 f"issue a certificate for {server_name}, or set router.server_name to a name it covers")


def certificate_checks(cert_pem: Optional[bytes], key_pem: Optional[bytes], *, cert_path: str, key_path: str,
                       server_name: str, now: Optional[dt.datetime] = None, why_cert: Optional[str] = None,
                       why_key: Optional[str] = None) -> tuple[list[Check], dict]:
    """(checks, facts) for the PEM bytes of the certificate file and the key file (None: not readable, ``why_*``
    says why). facts: {"not_after", "not_before", "subject_alt_names"} (ISO UTC times) when the certificate parsed."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if cert_pem is None:
        return [Check("tls_certificate", "fail", why_cert or f"{cert_path} could not be read",
                      "check router.tls.certificate: the file must exist on the router host")], {}
    try:
        cert = _load_leaf(cert_pem)
    except ValueError:
        return [Check("tls_certificate", "fail", f"{cert_path} holds no PEM certificate",
                      "point router.tls.certificate at the full chain PEM (leaf first)")], {}
    from cryptography import x509

    try:
        sans = [str(v.value) for v in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]
    except x509.ExtensionNotFound:
        sans = []
    facts = {"not_after": cert.not_valid_after_utc.isoformat(), "not_before": cert.not_valid_before_utc.isoformat(),
             "subject_alt_names": sans}
    return [expiry_check(cert, cert_path, now), key_check(cert, key_pem, cert_path, key_path, why_key),
            name_check(cert, cert_path, server_name)], facts


def _read(host, path: str) -> tuple[Optional[bytes], Optional[str]]:
    """(bytes, None) or (None, why). A file only root can read (a 0600 key) is read with sudo."""
    from deployctl.errors import RemoteError

    try:
        return host.read_bytes(path), None
    except RemoteError as first:
        why = first.message
        if "ermission denied" not in why:
            return None, why
        try:
            return host.sudo(["cat", "--", path], timeout=30).stdout.encode(), None
        except RemoteError as second:
            return None, f"{why}; with sudo: {second.message}"


# Run on the router host: one TLS handshake to ADDRESS:PORT with SNI NAME, no verification (the leaf is compared
# with the file, not trusted); prints the leaf as base64 DER, or "error: ..." on failure.
SERVED_SNIPPET = r"""
import base64, socket, ssl, sys
addr, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    with socket.create_connection((addr, port), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=name) as s:
        print(base64.b64encode(s.getpeercert(binary_form=True)).decode())
except (OSError, ssl.SSLError) as exc:
    print("error: %s" % exc)
"""


def served_leaf(host, cfg) -> tuple[Optional[bytes], Optional[str]]:
    """(DER of the leaf nginx serves, None) or (None, why), from a handshake made on the router host ``host`` to
    ``router.listen_address`` (127.0.0.1 when nginx listens on every address) at ``router.listen``."""
    import base64

    from deployctl.errors import DeployctlError

    r = cfg.router
    addr = r.listen_address or "127.0.0.1"
    try:
        out = host.run([host.config.python, "-S", "-c", SERVED_SNIPPET, addr, str(r.listen), r.server_name],
                       timeout=30).stdout.strip().splitlines()
    except DeployctlError as err:
        return None, err.message
    line = out[-1] if out else "error: no answer"
    if line.startswith("error:"):
        return None, f"TLS handshake with {addr}:{r.listen} on {host.name} failed: {line[7:]}"
    return base64.b64decode(line), None


def describe(cert) -> str:
    """``notAfter YYYY-MM-DD HH:MM UTC, sha256 AB:CD:..(first 8 bytes), SAN a, b``: how a leaf is named to a person."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    fp = cert.fingerprint(hashes.SHA256()).hex().upper()
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        sans = []
    return (f"notAfter {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, sha256 {':'.join(fp[i:i + 2] for i in range(0, 16, 2))}…, "
            f"SAN {', '.join(sans) or 'none'}")


def served_check(served_der: Optional[bytes], cert_pem: Optional[bytes], *, cert_path: str, where: str,
                 why: Optional[str] = None, after_reload: bool = False,
                 now: Optional[dt.datetime] = None) -> Check:
    """``tls_served``: the leaf served at ``where`` against the file's leaf (module doc)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = now or dt.datetime.now(dt.timezone.utc)
    if served_der is None:
        return Check("tls_served", "fail" if after_reload else "warn", f"cannot read the certificate served at "
                     f"{where}: {why}", "start nginx (or check router.listen / listen_address), then re-run")
    served = x509.load_der_x509_certificate(served_der)
    try:
        file_cert = _load_leaf(cert_pem) if cert_pem else None
    except ValueError:
        file_cert = None
    if served.not_valid_after_utc <= now:
        return Check("tls_served", "fail", f"nginx at {where} serves an expired certificate ({describe(served)})",
                     RENEW_FIX)
    if file_cert is not None and served.fingerprint(hashes.SHA256()) == file_cert.fingerprint(hashes.SHA256()):
        return Check("tls_served", "pass", f"nginx at {where} serves {cert_path} ({describe(served)})")
    got = f"nginx at {where} serves {describe(served)}"
    want = f"{cert_path} holds {describe(file_cert)}" if file_cert is not None else f"{cert_path} is unreadable"
    if after_reload:
        return Check("tls_served", "fail", f"{got} after the reload, but {want}",
                     "check that nginx's ssl_certificate is router.tls.certificate and that the reload reached the "
                     "running master (nginx -s reload; `nginx -T`)")
    return Check("tls_served", "warn", f"{got}, but {want}: a renewed file not yet loaded",
                 "`deployctl router reload` (nginx reads certificates only when it (re)loads)")


def file_expiry_guard(host, cfg, now: Optional[dt.datetime] = None, *, within_days: float = 0) -> Optional[Check]:
    """The ``tls_certificate`` check of ``router.tls.certificate`` read on the router host ``host`` when it is
    expired, not yet valid or unreadable (what a reload must not put in service), or expires within ``within_days``
    days (`router reload` passes CERT_WARN_DAYS: a certificate inside the warning window is not put in service
    unless forced); else None. Raises RemoteError when the router host cannot be reached."""
    tls = cfg.router.tls
    pem, why = _read(host, tls.certificate)
    if pem is None:
        return Check("tls_certificate", "fail", why or f"{tls.certificate} could not be read",
                     "check router.tls.certificate: the file must exist on the router host")
    try:
        cert = _load_leaf(pem)
    except ValueError:
        return Check("tls_certificate", "fail", f"{tls.certificate} holds no PEM certificate",
                     "point router.tls.certificate at the full chain PEM (leaf first)")
    now = now or dt.datetime.now(dt.timezone.utc)
    if now < cert.not_valid_before_utc or cert.not_valid_after_utc <= now + dt.timedelta(days=within_days):
        return expiry_check(cert, tls.certificate, now)
    return None


def router_certificate(cfg, now: Optional[dt.datetime] = None, *, after_reload: bool = False,
                       served: bool = True) -> tuple[str, list[Check], dict]:
    """(router host name, checks, facts) for ``cfg.router.tls``, the files read on the router host, and (``served``)
    the leaf nginx serves there compared with the file (``tls_served``; ``after_reload``: a mismatch fails). An
    unreachable router host is one failed ``reach`` check."""
    from deployctl.errors import DeployctlError
    from deployctl.hosts import Host

    hc = cfg.router_host()
    tls = cfg.router.tls
    served_der, why_served = None, None
    try:
        with Host.from_config(hc) as host:
            cert_pem, why_cert = _read(host, tls.certificate)
            key_pem, why_key = _read(host, tls.key)
            if served:
                served_der, why_served = served_leaf(host, cfg)
    except DeployctlError as err:
        return hc.name, [Check("reach", "fail", f"router host {hc.name}: {err.message}", err.fix)], {}
    checks, facts = certificate_checks(cert_pem, key_pem, cert_path=tls.certificate, key_path=tls.key,
                                       server_name=cfg.router.server_name, now=now, why_cert=why_cert,
                                       why_key=why_key)
    if served:
        where = f"{cfg.router.listen_address or '127.0.0.1'}:{cfg.router.listen} on {hc.name}"
        checks.append(served_check(served_der, cert_pem, cert_path=tls.certificate, where=where, why=why_served,
                                   after_reload=after_reload, now=now))
    return hc.name, checks, {"tls": facts}
