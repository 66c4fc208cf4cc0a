"""SASL APIs: SaslHandshake (17) and SaslAuthenticate (36), for the proxy's own authenticated connections.

Wire grammar:
    SaslHandshakeRequest     => mechanism                       (v0-1, never flexible; v1 = tokens framed in
    SaslHandshakeResponse    => error_code [mechanisms]          SaslAuthenticate, v0 = raw tokens: not used)
    SaslAuthenticateRequest  => auth_bytes                      (v0-2, flexible v2+)
    SaslAuthenticateResponse => error_code error_message auth_bytes session_lifetime_ms(v1+)
Transcribed from Apache Kafka 4.1's common/message/Sasl*.json.
"""

from __future__ import annotations

from protocol.schema import F, Message

SASL_HANDSHAKE_REQUEST = Message('SaslHandshakeRequest', api_key=17, versions='0-1', flexible='none', fields=[
    F('mechanism', 'string', '0+'),
])

SASL_HANDSHAKE_RESPONSE = Message('SaslHandshakeResponse', api_key=17, versions='0-1', flexible='none', fields=[
    F('error_code', 'int16', '0+'),
    F('mechanisms', '[]string', '0+'),
])

SASL_AUTHENTICATE_REQUEST = Message('SaslAuthenticateRequest', api_key=36, versions='0-2', flexible='2+', fields=[
    F('auth_bytes', 'bytes', '0+'),
])

SASL_AUTHENTICATE_RESPONSE = Message('SaslAuthenticateResponse', api_key=36, versions='0-2', flexible='2+', fields=[
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+'),
    F('auth_bytes', 'bytes', '0+'),
    F('session_lifetime_ms', 'int64', '1+', default=0),
])
