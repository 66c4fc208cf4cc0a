"""tierproxy's own identity toward the brokers (`--command-config`): SASL and TLS for every connection it opens
on its own behalf (metadata topic clients, control connections, the tiering job and its executors)."""

from tierproxy.config.identity.properties import ClientIdentity, IdentityError, OAuthClient, load_command_config

__all__ = ["ClientIdentity", "IdentityError", "OAuthClient", "load_command_config"]
