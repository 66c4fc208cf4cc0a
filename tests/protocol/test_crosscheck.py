"""Our decoding agrees with kafka-python 3.x's independent codec on every shared API and version."""

from __future__ import annotations

import pytest

from protocol import registry
from tests.support.crosscheck import THEIRS, common_fields_differ, theirs_decode
from tests.support.samples import sample

CASES = [(key, kind, v) for (key, kind) in THEIRS
         for msg in [getattr(registry.SUPPORTED[key], kind)] if msg is not None
         for v in range(msg.min_version, msg.max_version + 1)]


@pytest.mark.parametrize(("api_key", "kind", "version"), CASES, ids=[f"{k}-{t}-v{v}" for k, t, v in CASES])
def test_same_fields_as_kafka_python(api_key: int, kind: str, version: int) -> None:
    msg = getattr(registry.SUPPORTED[api_key], kind)
    data = sample(msg, version, seed=11)
    if api_key == 18 and kind == "response":
        data["error_code"] = 0  # with an error both codecs read the body as v0 (tested below)
    encoded = msg.encode(data, version)
    ours = msg.decode(memoryview(encoded), version)
    theirs = theirs_decode(api_key, kind, version, encoded)
    assert theirs is not None
    assert common_fields_differ(ours, theirs) == []


def test_api_versions_error_response_falls_back_to_v0() -> None:
    msg = registry.SUPPORTED[18].response
    body = msg.encode({"error_code": 35, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}, 0)
    frame = memoryview(b"\x00\x00\x00\x01" + body)
    got = registry.decode_response(18, 4, frame, 4)
    assert got["error_code"] == 35 and got["api_keys"][0]["max_version"] == 4
    theirs = theirs_decode(18, "response", 4, body)
    assert theirs is not None and theirs["error_code"] == 35
