"""A secured Kafka 4.x broker for the `--command-config` tests: SASL_PLAINTEXT and SASL_SSL listeners (PLAIN,
SCRAM-SHA-512, OAUTHBEARER against a local JWKS), an SSL listener requiring client certificates (mTLS),
`StandardAuthorizer` with `allow.everyone.if.no.acl.found=false`.

The PLAINTEXT and CONTROLLER listeners are the cluster's internal ones (inter-broker and controller traffic):
their principal, ANONYMOUS, is the super user, and the tests use them for setup (topics, ACLs, retention) only.
Every client and tierproxy itself go through the secured listeners.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.certs import Certs, client_cert, make_certs
from tests.support.oauth import AUDIENCE, OAuthServer, oauth_server
from tests.support.parts import unavailable
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable

PRINCIPAL = "tierproxy"  # every mechanism maps tierproxy's identity to User:tierproxy
PASSWORDS = {"tierproxy": "tp-secret-9f3a", "alice": "alice-secret", "bob": "bob-secret"}
OAUTH_SECRET = "oauth-secret-77c1"


@dataclass
class Secured:
    kafka: KafkaCluster
    certs: Certs
    oauth: OAuthServer
    client_cert: Path  # CN=tierproxy
    client_key: Path

    @property
    def admin(self) -> str:
        """The internal PLAINTEXT listener (super user): setup only."""
        return self.kafka.bootstrap

    def listener(self, name: str) -> str:
        return self.kafka.bootstrap_for(name)


def _sasl_listener(name: str, jwks: str) -> dict[str, str]:
    users = " ".join(f'user_{u}="{p}"' for u, p in PASSWORDS.items())
    p = f"listener.name.{name}"
    return {
        f"{p}.plain.sasl.jaas.config": f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        f"{p}.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        f"{p}.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        f"{p}.oauthbearer.sasl.server.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    }


@pytest.fixture(scope="package")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    d = tmp_path_factory.mktemp("secured")
    certs = make_certs(d / "certs")
    cert, key = client_cert(d / "certs", certs, PRINCIPAL)
    with oauth_server({PRINCIPAL: OAUTH_SECRET}) as oauth:
        config = {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": "User:ANONYMOUS",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512,OAUTHBEARER",
            "sasl.oauthbearer.jwks.endpoint.url": oauth.jwks_url,
            "sasl.oauthbearer.expected.audience": AUDIENCE,
            **_sasl_listener("sasl", oauth.jwks_url),
            **_sasl_listener("saslssl", oauth.jwks_url),
            "listener.name.saslssl.ssl.keystore.type": "PEM",
            "listener.name.saslssl.ssl.keystore.location": str(certs.keystore_pem),
            "listener.name.mtls.ssl.keystore.type": "PEM",
            "listener.name.mtls.ssl.keystore.location": str(certs.keystore_pem),
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(certs.ca),
            "listener.name.mtls.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        }
        try:
            kafka = KafkaCluster(1, workdir=d / "kafka", broker_config=config,
                                 extra_listeners={"SASL": "SASL_PLAINTEXT", "SASLSSL": "SASL_SSL", "MTLS": "SSL"},
                                 jvm_options=[f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={oauth.jwks_url}"],
                                 scram_users={"SCRAM-SHA-512": {u: p for u, p in PASSWORDS.items()}}).start()
        except KafkaUnavailable as exc:
            unavailable("Apache Kafka with SASL, SSL and ACLs", str(exc))
        try:
            yield Secured(kafka, certs, oauth, cert, key)
        finally:
            kafka.stop()
