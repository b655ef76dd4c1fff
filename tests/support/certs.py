"""Certificates made in the test with ``cryptography``: a CA and leaf certificates it signs (EC P-256 keys).

``TestCA(dir)``: ``ca.pem`` in ``dir`` (pass it as ``verify=`` to httpx or the openai client);
``ca.issue(name, names=[...], days=90, not_before_days=1, key=None) -> (cert_path, key_path)`` writes
``name.pem`` (leaf then CA, as nginx wants the chain) and ``name.key`` (PKCS#8, 0600). Negative ``days`` give an
expired certificate; ``key=`` another issued file's key path reuses that key (a renewed certificate).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

__all__ = ["TestCA"]


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class TestCA:
    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deployctl test CA")])
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=3650))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.path = self.dir / "ca.pem"
        self.path.write_bytes(self._pem(self.cert))

    @staticmethod
    def _pem(cert) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, names: list[str], *, days: float = 90, not_before_days: float = 1,
              key: Path | None = None) -> tuple[Path, Path]:
        """A leaf for ``names`` (DNS SANs; IP addresses become IP SANs) valid from ``not_before_days`` ago until
        ``days`` from now. Returns (chain PEM path, key PEM path)."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        leaf_key = serialization.load_pem_private_key(key.read_bytes(), None) if key else _key()
        sans = []
        for n in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject).public_key(leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(min(now - dt.timedelta(days=not_before_days), now + dt.timedelta(days=days - 1)))
                .not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert_path.write_bytes(self._pem(cert) + self._pem(self.cert))
        key_path.write_bytes(_pem_key(leaf_key))
        key_path.chmod(0o600)
        return cert_path, key_path
