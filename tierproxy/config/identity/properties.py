"""A Kafka client properties file, as Kafka's CLI tools take it with ``--command-config``, parsed into a
`ClientIdentity`.

Supported keys (anything else fails at start, naming the key):
    security.protocol                      PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl.mechanism                         PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER
    sasl.jaas.config                       PlainLoginModule / ScramLoginModule (username, password),
                                           OAuthBearerLoginModule (clientId, clientSecret, scope)
    sasl.oauthbearer.token.endpoint.url    client-credentials token endpoint (OAUTHBEARER)
    sasl.oauthbearer.scope, sasl.oauthbearer.client.credentials.client.id / .client.secret  (Kafka 4.1 names)
    sasl.login.callback.handler.class      only Kafka's OAuthBearerLoginCallbackHandler (what Java clients need)
    sasl.login.refresh.window.factor       fraction of a token's lifetime after which it is renewed (0.8)
    ssl.truststore.type / .location / .certificates / .password      PEM or PKCS12
    ssl.keystore.type / .location / .certificate.chain / .key / .password, ssl.key.password   PEM or PKCS12
    ssl.endpoint.identification.algorithm  https (default: check the broker's host name) or empty (do not)
    client.id                              the client id of tierproxy's own requests
    bootstrap.servers                      a listener for tierproxy's own connections only (default: the
                                           `--bootstrap-server` the clients are relayed to), e.g. an mTLS one

Key material is read at start (a missing file fails then) and carried in the identity, so the tiering job can
ship it to executors that do not have the file. Secrets are `SecretStr`: never in a repr, a log or `describe()`.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from tierproxy.config.identity import keystores
from tierproxy.config.propfile import ConfigError, read_properties


class IdentityError(ValueError):
    """The command config is unusable; the message names the key and the reason (never a secret)."""


PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}
OAUTH_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                  "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler")
KEYS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.jaas.config", "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope", "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret", "sasl.login.callback.handler.class",
    "sasl.login.refresh.window.factor", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.certificates", "ssl.truststore.password", "ssl.keystore.type", "ssl.keystore.location",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.keystore.password", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "client.id", "bootstrap.servers",
})
# JAAS: <LoginModule class> <flag> (key=value)* ;   values "quoted" (with \" escapes) or bare
_JAAS = re.compile(r'\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;\s*$', re.S)
_JAAS_OPTION = re.compile(r'\s*([\w.\-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')


@dataclass(frozen=True)
class OAuthClient:
    """The OAuth 2 client-credentials grant tierproxy uses to get its OAUTHBEARER tokens."""

    token_endpoint: str
    client_id: str
    client_secret: SecretStr = field(repr=False)
    scope: str | None = None
    refresh_window_factor: float = 0.8


@dataclass(frozen=True)
class ClientIdentity:
    """Who tierproxy is toward the brokers, and how its connections are secured."""

    security_protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    oauth: OAuthClient | None = None
    trusted_pem: str | None = None  # CA certificates (PEM); None: the system's
    cert_chain_pem: str | None = None  # client certificate chain (PEM), for mTLS
    key_pem: SecretStr | None = field(default=None, repr=False)  # its private key (PEM, unencrypted)
    check_hostname: bool = True
    client_id: str | None = None
    bootstrap: str | None = None  # own listener HOST:PORT[,..] when apart from the relayed one
    source: str = ""  # the file it came from (for messages)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def principal_hint(self) -> str:
        """Who this identity claims to be, for messages: the SASL user, the OAuth client id or 'certificate'."""
        if self.mechanism == "OAUTHBEARER" and self.oauth is not None:
            return f"client {self.oauth.client_id!r}"
        if self.username:
            return f"user {self.username!r}"
        return "its certificate" if self.cert_chain_pem else "anonymous"

    def ssl_context(self, *, with_client_cert: bool = True) -> ssl.SSLContext | None:
        """TLS toward the brokers (None for PLAINTEXT / SASL_PLAINTEXT). `with_client_cert=False` leaves the
        keystore out: relayed client connections must never carry tierproxy's certificate."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.trusted_pem)
        ctx.check_hostname = self.check_hostname
        if with_client_cert and self.cert_chain_pem and self.key_pem is not None:
            keystores.load_cert_chain(ctx, self.cert_chain_pem, self.key_pem.get_secret_value())
        return ctx

    def describe(self) -> dict[str, Any]:
        """What may be shown (admin API, run summary, logs): no password, secret, token or key."""
        return {"security.protocol": self.security_protocol, "sasl.mechanism": self.mechanism,
                "principal": self.principal_hint, "ssl.client.certificate": bool(self.cert_chain_pem),
                "token.endpoint": self.oauth.token_endpoint if self.oauth else None,
                "bootstrap.servers": self.bootstrap, "source": self.source}


def parse_jaas(value: str, key: str = "sasl.jaas.config") -> tuple[str, dict[str, str]]:
    """`Module required a="b" c=d;` → (module, options)."""
    m = _JAAS.match(value)
    if m is None:
        raise IdentityError(f"{key}: expected '<LoginModule> required key=\"value\" ...;'")
    options: dict[str, str] = {}
    rest = m.group(3)
    pos = 0
    while pos < len(rest):
        o = _JAAS_OPTION.match(rest, pos)
        if o is None:
            if rest[pos:].strip():
                raise IdentityError(f"{key}: cannot parse the options of {m.group(1)} near "
                                    f"{rest[pos:pos + 12].split('=')[0]!r}")
            break
        options[o.group(1)] = o.group(2).replace('\\"', '"') if o.group(2) is not None else o.group(3)
        pos = o.end()
    return m.group(1), options


def identity_from_properties(props: dict[str, str], source: str = "") -> ClientIdentity:
    """Validate the keys and build the identity; `IdentityError` names the first bad key."""
    where = f" (in {source})" if source else ""
    for key in props:
        if key not in KEYS:
            raise IdentityError(f"{key}: unsupported key{where}; supported: security.protocol, sasl.*, ssl.* "
                                f"as listed in docs/proxy.md 'Secured clusters'")
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise IdentityError(f"security.protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}{where}")
    fields: dict[str, Any] = {"security_protocol": protocol, "source": source, "client_id": props.get("client.id"),
                              "bootstrap": _bootstrap(props.get("bootstrap.servers"), where)}
    if protocol.startswith("SASL_"):
        fields.update(_sasl(props, where))
    elif "sasl.mechanism" in props or "sasl.jaas.config" in props:
        raise IdentityError(f"sasl.mechanism: set, but security.protocol is {protocol} (SASL needs SASL_PLAINTEXT or "
                            f"SASL_SSL){where}")
    if protocol in ("SSL", "SASL_SSL"):
        fields.update(_tls(props, where))
    return ClientIdentity(**fields)


def _bootstrap(value: str | None, where: str) -> str | None:
    if value is None:
        return None
    servers = [s.strip() for s in value.split(",") if s.strip()]
    for s in servers:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise IdentityError(f"bootstrap.servers: {s!r} is not HOST:PORT{where}")
    if not servers:
        raise IdentityError(f"bootstrap.servers: empty{where}")
    return ",".join(servers)


def _sasl(props: dict[str, str], where: str) -> dict[str, Any]:
    mechanism = props.get("sasl.mechanism", "GSSAPI").upper()  # Kafka's default
    if mechanism not in LOGIN_MODULES:
        raise IdentityError(f"sasl.mechanism: {mechanism} is not supported (use one of "
                            f"{', '.join(LOGIN_MODULES)}){where}")
    jaas = props.get("sasl.jaas.config")
    module, options = parse_jaas(jaas) if jaas else ("", {})
    if jaas and module != LOGIN_MODULES[mechanism]:
        raise IdentityError(f"sasl.jaas.config: {module} does not go with sasl.mechanism={mechanism} "
                            f"(expected {LOGIN_MODULES[mechanism]}){where}")
    if mechanism != "OAUTHBEARER":
        if not options.get("username") or "password" not in options:
            raise IdentityError(f"sasl.jaas.config: {mechanism} needs username and password{where}")
        return {"mechanism": mechanism, "username": options["username"], "password": SecretStr(options["password"])}
    handler = props.get("sasl.login.callback.handler.class")
    if handler is not None and handler not in OAUTH_HANDLERS:
        raise IdentityError(f"sasl.login.callback.handler.class: {handler} is not supported (only Kafka's "
                            f"OAuthBearerLoginCallbackHandler, the client-credentials flow){where}")
    endpoint = props.get("sasl.oauthbearer.token.endpoint.url")
    client_id = props.get("sasl.oauthbearer.client.credentials.client.id", options.get("clientId"))
    secret = props.get("sasl.oauthbearer.client.credentials.client.secret", options.get("clientSecret"))
    if not endpoint:
        raise IdentityError(f"sasl.oauthbearer.token.endpoint.url: OAUTHBEARER needs the token endpoint{where}")
    if not endpoint.startswith(("http://", "https://")):
        raise IdentityError(f"sasl.oauthbearer.token.endpoint.url: not an http(s) URL{where}")
    if not client_id or secret is None:
        raise IdentityError(f"sasl.jaas.config: OAUTHBEARER needs clientId and clientSecret{where}")
    factor = props.get("sasl.login.refresh.window.factor", "0.8")
    try:
        window = float(factor)
    except ValueError:
        window = -1.0
    if not 0.5 <= window <= 1.0:
        raise IdentityError(f"sasl.login.refresh.window.factor: {factor!r} is not between 0.5 and 1.0{where}")
    scope = props.get("sasl.oauthbearer.scope", options.get("scope"))
    return {"mechanism": mechanism,
            "oauth": OAuthClient(endpoint, client_id, SecretStr(secret), scope or None, window)}


def _tls(props: dict[str, str], where: str) -> dict[str, Any]:
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", ""):
        raise IdentityError(f"ssl.endpoint.identification.algorithm: {algorithm!r} is not 'https' or empty{where}")
    try:
        trusted = keystores.truststore(props)
        chain, key = keystores.keystore(props)
    except keystores.KeystoreError as exc:
        raise IdentityError(f"{exc}{where}") from None
    return {"trusted_pem": trusted, "cert_chain_pem": chain, "key_pem": SecretStr(key) if key else None,
            "check_hostname": algorithm == "https"}


def load_command_config(path: str | Path) -> ClientIdentity:
    """Read a `--command-config` file; `IdentityError` names the file, the key and the reason."""
    p = Path(path)
    if not p.is_file():
        raise IdentityError(f"command.config: no such file {p}")
    try:
        props = read_properties(p)
    except ConfigError as exc:
        raise IdentityError(str(exc)) from None
    return identity_from_properties(props, str(p))
