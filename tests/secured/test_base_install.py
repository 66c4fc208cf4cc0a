"""`restore` of the base install (`pip install kafka-tierproxy`: no PySpark, no numpy) against a real secured broker
that refuses it: a password the broker refuses, a certificate chain the client does not trust. One line, exit 3
(tierproxy's identity refused, as for `tier`: docs/operations.md), no traceback, no secret, and no job dependency
reached for. Before: a 40-line traceback (exit 1), the error handler importing the Iceberg job (numpy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.secured.conftest import PASSWORDS, PRINCIPAL, Secured
from tests.support.base_install import one_line, refused_imports, run_base

pytestmark = [pytest.mark.kafka, pytest.mark.process]
WRONG = "not-the-password-4411"


def _restore(secured: Secured, tmp: Path, listener: str, config: list[str]) -> str:
    """`restore --dry-run` of an empty tier into the secured broker as `config` says: its one line (exit 3)."""
    (tmp / "client.properties").write_text("\n".join(config) + "\n")
    out = run_base(tmp, "restore", "--dry-run", "--bootstrap-server", secured.listener(listener), "--storage",
                   f"file://{tmp}/tier", "--command-config", str(tmp / "client.properties"))
    assert refused_imports(tmp) == []
    return one_line(out, 3)


def test_restore_whose_password_is_refused_says_so_in_one_line(secured: Secured, tmp_path: Path) -> None:
    line = _restore(secured, tmp_path, "SASL", [
        "security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{PRINCIPAL}" password="{WRONG}";'])
    assert line.startswith("tierproxy: authentication failed: ") and "PLAIN" in line, line
    assert WRONG not in line and PASSWORDS[PRINCIPAL] not in line


def test_restore_toward_a_broker_whose_ca_it_does_not_trust_says_tls_failed(secured: Secured,
                                                                            tmp_path: Path) -> None:
    """SASL_SSL with the system's CAs only: the broker's certificate chains to the test's own CA."""
    line = _restore(secured, tmp_path, "SASLSSL", [
        "security.protocol=SASL_SSL", "sasl.mechanism=PLAIN",
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{PRINCIPAL}" password="{PASSWORDS[PRINCIPAL]}";'])
    assert line.startswith(f"tierproxy: TLS toward the brokers failed ({secured.listener('SASLSSL')})"), line
    assert "CERTIFICATE_VERIFY_FAILED" in line and PASSWORDS[PRINCIPAL] not in line, line
