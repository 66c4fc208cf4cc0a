"""A topic refused its typed table (TableCollision: the table was made for another topic) in a round of passes
against a real broker: the other typed tables of the round still get their passes, and the round then fails with the
refusal (exit 2, one line). Before, the round stopped at the refused topic: every table after it in the round was
never written again (in the `tier` loop, round after round), while the tier's retention went on deleting what they
never got."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.iceberg import Step, pyiceberg_table
from tests.support.kafka import create_topic, fill_topic
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog
from tierproxy.jobs.iceberg.typed_tables import TypedOptions, open_typed

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_a_refused_topic_does_not_stop_the_other_typed_tables_of_its_round(kafka: KafkaCluster,
                                                                          tmp_path: Path) -> None:
    prefix = f"col{os.getpid()}"
    refused, other = f"{prefix}.x", f"{prefix}z"  # kv.<prefix>_x, made for `<prefix>-x`; kv.<prefix>z after it
    for topic in (refused, other):
        create_topic(kafka.bootstrap, topic)
        fill_topic(kafka.bootstrap, topic, 300)
    assert tier_once(settings(kafka.bootstrap, tmp_path, refused, tier_topics=f"{re.escape(prefix)}.*")).segments
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    open_typed(open_catalog(cfg), cfg, f"kv.{prefix}_x", TypedOptions(None, f"{prefix}-x-value",
                                                                      value_format="bytes"))
    step = Step(kafka.bootstrap, tmp_path, other)
    proc = run_cli(*step.cmd()[3:], cwd=tmp_path, env=step.env(
        TIERPROXY_ICEBERG_TABLES=f"{re.escape(prefix)}.*=kv.{{topic}}", TIERPROXY_ICEBERG_VALUE_FORMAT="bytes"))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "TableCollision" not in proc.stderr and f"'{prefix}-x'" in proc.stderr, proc.stderr[-3000:]
    table = pyiceberg_table(step.uri, step.warehouse, f"kv.{other}")  # the round went on past the refused topic
    assert table.scan().to_arrow().num_rows > 0
