"""`--command-config` parsing: Kafka's client property names, JAAS, PEM and PKCS12 key material; every bad key
fails at start naming it; secrets never in a repr, `describe()` or an error."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509 import load_pem_x509_certificate

from tests.support.certs import client_cert, make_certs
from tests.support.waiting import wait_until
from tierproxy.config import ConfigError, TierSettings, load_settings
from tierproxy.config.identity import IdentityError, load_command_config
from tierproxy.config.identity.clients import aiokafka_options
from tierproxy.config.identity.properties import identity_from_properties, parse_jaas
from tierproxy.config.identity.sasl import conversation

SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="tp" '
         'password="s3cr=t;\\"x";')


def props(**kv: str) -> dict[str, str]:
    return {k.replace("_", "."): v for k, v in kv.items()}


def test_jaas_options_quoted_bare_and_escaped() -> None:
    module, options = parse_jaas(SCRAM)
    assert module == "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert options == {"username": "tp", "password": 's3cr=t;"x'}
    assert parse_jaas("a.B required x=1 y=\"two words\";") == ("a.B", {"x": "1", "y": "two words"})
    with pytest.raises(IdentityError, match=r"sasl\.jaas\.config"):
        parse_jaas("no flag here;")


def test_a_properties_file_with_continuation_lines(tmp_path: Path) -> None:
    f = tmp_path / "client.properties"
    f.write_text("# own identity\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                 "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
                 '    username="tp" \\\n    password="pw";\n')
    ident = load_command_config(f)
    assert (ident.security_protocol, ident.mechanism, ident.username) == ("SASL_PLAINTEXT", "SCRAM-SHA-512", "tp")
    assert ident.password is not None and ident.password.get_secret_value() == "pw"
    assert "pw" not in repr(ident) and "pw" not in str(ident.describe())


@pytest.mark.parametrize(("bad", "key"), [
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_PLAINTEXT"}, "sasl.mechanism"),  # Kafka's default, GSSAPI: unsupported
    ({"security.protocol": "TLS"}, "security.protocol"),
    ({"security.protocol": "PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM},
     "sasl.jaas.config"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
      "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                          'clientId="a" clientSecret="b";'}, "sasl.oauthbearer.token.endpoint.url"),
    ({"ssl.truststore.location": "/x", "security.protocol": "SSL", "ssl.truststore.type": "JKS"},
     "ssl.truststore.type"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"}, "ssl.truststore.location"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"},
     "ssl.endpoint.identification.algorithm"),
    ({"bootstrap.servers.extra": "x"}, "bootstrap.servers.extra"),
])
def test_bad_keys_fail_naming_the_key(bad: dict[str, str], key: str) -> None:
    with pytest.raises(IdentityError) as err:
        identity_from_properties(bad)
    assert str(err.value).startswith(key), err.value


def test_a_bad_command_config_stops_settings_naming_the_key(tmp_path: Path) -> None:
    f = tmp_path / "c.properties"
    f.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.password=hunter2\n")
    with pytest.raises(ConfigError) as err:
        load_settings(TierSettings, cli={"bootstrap_servers": "k:9092", "command_config": str(f)})
    assert "command.config" in str(err.value) and "sasl.password: unsupported key" in str(err.value)
    assert "hunter2" not in str(err.value)


def test_pem_and_pkcs12_key_material_give_the_same_tls_identity(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    cert, key = client_cert(tmp_path, certs, "tierproxy")
    pem = identity_from_properties(props(security_protocol="SSL", ssl_truststore_type="PEM",
                                         ssl_truststore_location=str(certs.ca), ssl_keystore_type="PEM",
                                         ssl_keystore_location=str(tmp_path / "ks.pem")) if (
        (tmp_path / "ks.pem").write_text(key.read_text() + cert.read_text())) else {})
    x509 = load_pem_x509_certificate(cert.read_bytes())
    pk = serialization.load_pem_private_key(key.read_bytes(), None)
    ca = load_pem_x509_certificate(certs.ca.read_bytes())
    enc = serialization.BestAvailableEncryption(b"storepass")
    (tmp_path / "ks.p12").write_bytes(pkcs12.serialize_key_and_certificates(b"tp", pk, x509, None, enc))  # type: ignore[arg-type]
    (tmp_path / "ts.p12").write_bytes(pkcs12.serialize_key_and_certificates(b"ca", None, None, [ca], enc))
    p12 = identity_from_properties(props(
        security_protocol="SSL", ssl_truststore_type="PKCS12", ssl_truststore_location=str(tmp_path / "ts.p12"),
        ssl_truststore_password="storepass", ssl_keystore_type="PKCS12",
        ssl_keystore_location=str(tmp_path / "ks.p12"), ssl_keystore_password="storepass"))
    assert (p12.trusted_pem, p12.cert_chain_pem) == (pem.trusted_pem, pem.cert_chain_pem)
    assert p12.key_pem is not None and pem.key_pem is not None
    assert p12.key_pem.get_secret_value() == pem.key_pem.get_secret_value()
    ctx = p12.ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert "PRIVATE KEY" not in repr(p12) and "storepass" not in str(p12.describe())
    with pytest.raises(IdentityError, match=r"ssl\.keystore\.location: not a PKCS12 store"):
        identity_from_properties(props(security_protocol="SSL", ssl_keystore_type="PKCS12",
                                       ssl_keystore_location=str(tmp_path / "ks.p12"), ssl_keystore_password="no"))


def test_aiokafka_options_carry_the_identity() -> None:
    ident = identity_from_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                      "sasl.jaas.config": SCRAM, "client.id": "tp-own"})
    opts = aiokafka_options(ident)
    assert opts == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "tp", "sasl_plain_password": 's3cr=t;"x', "client_id": "tp-own"}
    assert aiokafka_options(None) == {}


def test_the_plain_conversation_and_a_refusal_naming_the_mechanism() -> None:
    ident = identity_from_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                      "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                                          'required username="tp" password="pw";'})
    talk = conversation(ident)
    assert next(talk) == (17, 1, {"mechanism": "PLAIN"})
    assert talk.send({"error_code": 0, "mechanisms": ["PLAIN"]}) == (36, 2, {"auth_bytes": b"\0tp\0pw"})
    with pytest.raises(ConnectionError) as err:
        talk.send({"error_code": 58, "error_message": "Authentication failed: Invalid username or password",
                   "auth_bytes": b"", "session_lifetime_ms": 0})
    assert "SASL/PLAIN as user 'tp' failed: Authentication failed" in str(err.value) and "pw" not in str(err.value)
    talk = conversation(ident)
    next(talk)
    with pytest.raises(ConnectionError, match=r"does not enable PLAIN on this listener \(it enables SCRAM-SHA-512"):
        talk.send({"error_code": 33, "mechanisms": ["SCRAM-SHA-512"]})


def test_oauth_tokens_are_renewed_before_they_expire() -> None:
    """A token lives 2 s: after 0.8 of it the next connection gets a new one; before that the same one."""
    import time

    from pydantic import SecretStr

    from tests.support.oauth import oauth_server
    from tierproxy.config.identity.oauth import TokenSource
    from tierproxy.config.identity.properties import OAuthClient

    with oauth_server({"tp": "s3cret"}, lifetime_s=2) as srv:
        src = TokenSource(OAuthClient(srv.token_url, "tp", SecretStr("s3cret"), "kafka"))
        asked = time.monotonic()
        first = src.token()
        assert src.token() == first and src.fetched == 1
        renewed = wait_until(lambda: src.token() != first and time.monotonic(), "a renewed token", timeout=10,
                             interval=0.02)
        assert renewed - asked >= 0.8 * 2, "renewed before 0.8 of the token's life"
        assert src.fetched == 2 and srv.issued == ["tp", "tp"]
        bad = TokenSource(OAuthClient(srv.token_url, "tp", SecretStr("wrong"), None))
        with pytest.raises(ConnectionError) as err:
            bad.token()
        assert "HTTP 401" in str(err.value) and "client 'tp'" in str(err.value) and "wrong" not in str(err.value)
