"""A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Certs:
    ca: Path
    cert: Path
    key: Path
    keystore_pem: Path  # PKCS#8 key + certificate: Kafka's PEM keystore


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=tierproxy-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.pem", "-days", "2", "-extfile", "san.ext")
    run("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.p8.key")
    keystore = d / "keystore.pem"
    keystore.write_text((d / "server.p8.key").read_text() + (d / "server.pem").read_text())
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", keystore)


def client_cert(d: Path, certs: Certs, cn: str) -> tuple[Path, Path]:
    """A client certificate `CN=<cn>` signed by the test CA: (certificate PEM, PKCS#8 key PEM)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{cn}.key", "-out", f"{cn}.csr", "-subj", f"/CN={cn}")
    run("x509", "-req", "-in", f"{cn}.csr", "-CA", str(certs.ca), "-CAkey", str(certs.ca.parent / "ca.key"),
        "-CAcreateserial", "-out", f"{cn}.pem", "-days", "2")
    run("pkcs8", "-topk8", "-nocrypt", "-in", f"{cn}.key", "-out", f"{cn}.p8.key")
    return d / f"{cn}.pem", d / f"{cn}.p8.key"
