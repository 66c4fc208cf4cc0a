"""protocol.constants against the kafka-clients jar itself: every name and value as Kafka's Java code has it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from protocol.apis.keys import API_KEYS
from protocol.constants import ApiKey, ErrorCode, IsolationLevel, OffsetSpec
from tests.support.jvm import java_command
from tierproxy.dev.kafkadist import ensure_kafka_libs

# Java 11+ runs a single source file directly; it prints "kind name value" lines
PROGRAM = """
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.requests.ListOffsetsRequest;

public class Constants {
    public static void main(String[] args) {
        for (ApiKeys k : ApiKeys.values()) System.out.println("api " + k.name() + " " + k.id);
        for (Errors e : Errors.values()) System.out.println("error " + e.name() + " " + e.code());
        for (IsolationLevel i : IsolationLevel.values()) System.out.println("isolation " + i.name() + " " + i.id());
        System.out.println("spec LATEST " + ListOffsetsRequest.LATEST_TIMESTAMP);
        System.out.println("spec EARLIEST " + ListOffsetsRequest.EARLIEST_TIMESTAMP);
        System.out.println("spec MAX_TIMESTAMP " + ListOffsetsRequest.MAX_TIMESTAMP);
        System.out.println("spec EARLIEST_LOCAL " + ListOffsetsRequest.EARLIEST_LOCAL_TIMESTAMP);
        System.out.println("spec LATEST_TIERED " + ListOffsetsRequest.LATEST_TIERED_TIMESTAMP);
    }
}
"""


def _java_constants(tmp: Path) -> dict[str, dict[str, int]]:
    src = tmp / "Constants.java"
    src.write_text(PROGRAM)
    out = subprocess.run([*java_command(), "-cp", f"{ensure_kafka_libs()}/*", str(src)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    got: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        got.setdefault(kind, {})[name] = int(value)
    return got


def test_every_constant_is_kafkas(tmp_path: Path) -> None:
    java = _java_constants(tmp_path)
    assert len(java["api"]) > 70 and len(java["error"]) > 100  # the program really listed Kafka's enums
    for k in ApiKey:  # keys Kafka 4 retired (4-7, LeaderAndIsr...) are gone from its enum but keep their numbers
        assert java["api"].get(k.name, k.value) == k.value, k
    assert set(java["api"]) <= {k.name for k in ApiKey}, set(java["api"]) - {k.name for k in ApiKey}
    for e in ErrorCode:
        assert java["error"][e.name] == e.value, e
    assert {i.name: i.value for i in IsolationLevel} == java["isolation"]
    assert {s.name: s.value for s in OffsetSpec} == java["spec"]


def test_api_key_enum_and_the_key_table_agree() -> None:
    assert [k.value for k in ApiKey] == list(API_KEYS)
    for k in ApiKey:
        assert k.name.replace("_", "") == API_KEYS[k][0].upper(), k
