"""Trust and key material from Kafka's ``ssl.truststore.*`` / ``ssl.keystore.*`` keys, as PEM text.

PEM (files or inline ``ssl.truststore.certificates`` / ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain``,
the key optionally encrypted with ``ssl.key.password``) and PKCS12 (through `cryptography`). JKS is not
supported: convert it with ``keytool -importkeystore -deststoretype PKCS12``.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12


class KeystoreError(ValueError):
    """Unreadable trust or key material; the message names the key (never the secret)."""


def _store_type(props: dict[str, str], key: str) -> str:
    kind = props.get(key, "PEM" if key.startswith("ssl.truststore") or "ssl.keystore.key" in props else "JKS")
    kind = kind.upper()
    if kind not in ("PEM", "PKCS12"):
        raise KeystoreError(f"{key}: {kind} is not supported (PEM or PKCS12; convert JKS with keytool)")
    return kind


def _read(props: dict[str, str], key: str) -> bytes:
    path = Path(props[key])
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KeystoreError(f"{key}: cannot read {path}: {exc.strerror}") from None


def _pem_of(certs: list[x509.Certificate]) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def truststore(props: dict[str, str]) -> str | None:
    """The CA certificates as PEM text, or None for the system's."""
    if "ssl.truststore.certificates" in props:
        return _check_certs(props["ssl.truststore.certificates"], "ssl.truststore.certificates")
    if "ssl.truststore.location" not in props:
        return None
    kind = _store_type(props, "ssl.truststore.type")
    data = _read(props, "ssl.truststore.location")
    if kind == "PEM":
        return _check_certs(data.decode(errors="replace"), "ssl.truststore.location")
    password = props.get("ssl.truststore.password")
    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError:
        raise KeystoreError("ssl.truststore.location: not a PKCS12 store, or ssl.truststore.password is wrong") \
            from None
    certs = [c.certificate for c in store.additional_certs] + ([store.cert.certificate] if store.cert else [])
    if not certs:
        raise KeystoreError("ssl.truststore.location: the PKCS12 store holds no certificate")
    return _pem_of(certs)


def keystore(props: dict[str, str]) -> tuple[str | None, str | None]:
    """(certificate chain PEM, unencrypted private key PEM) for mTLS, or (None, None)."""
    if "ssl.keystore.key" in props or "ssl.keystore.certificate.chain" in props:
        if "ssl.keystore.key" not in props or "ssl.keystore.certificate.chain" not in props:
            raise KeystoreError("ssl.keystore.key: goes with ssl.keystore.certificate.chain")
        chain = _check_certs(props["ssl.keystore.certificate.chain"], "ssl.keystore.certificate.chain")
        return chain, _private_key(props["ssl.keystore.key"].encode(), props.get("ssl.key.password"),
                                   "ssl.keystore.key")
    if "ssl.keystore.location" not in props:
        return None, None
    kind = _store_type(props, "ssl.keystore.type")
    data = _read(props, "ssl.keystore.location")
    if kind == "PEM":
        text = data.decode(errors="replace")
        return _check_certs(text, "ssl.keystore.location"), _private_key(data, props.get("ssl.key.password"),
                                                                          "ssl.keystore.location")
    password = props.get("ssl.keystore.password")
    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError:
        raise KeystoreError("ssl.keystore.location: not a PKCS12 store, or ssl.keystore.password is wrong") from None
    if key is None or cert is None:
        raise KeystoreError("ssl.keystore.location: the PKCS12 store holds no private key with a certificate")
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return _pem_of([cert, *extra]), pem


def _check_certs(text: str, key: str) -> str:
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        raise KeystoreError(f"{key}: no PEM certificate in it") from None
    return _pem_of(certs)


def _private_key(data: bytes, password: str | None, key: str) -> str:
    start = data.find(b"-----BEGIN")
    while start >= 0 and b"PRIVATE KEY-----" not in data[start:start + 40]:
        start = data.find(b"-----BEGIN", start + 1)
    if start < 0:
        raise KeystoreError(f"{key}: no PEM private key in it")
    try:
        pk = serialization.load_pem_private_key(data[start:], password.encode() if password else None)
    except (ValueError, TypeError):
        raise KeystoreError(f"{key}: the private key cannot be read (encrypted without the right "
                            f"ssl.key.password?)") from None
    return pk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()


def load_cert_chain(ctx: ssl.SSLContext, chain_pem: str, key_pem: str) -> None:
    """`SSLContext.load_cert_chain` reads files only: the PEM goes through a private file, removed at once."""
    fd, name = tempfile.mkstemp(prefix="tierproxy-key-", suffix=".pem")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key_pem + chain_pem)
        ctx.load_cert_chain(name)
    finally:
        os.unlink(name)
