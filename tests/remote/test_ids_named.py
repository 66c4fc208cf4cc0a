"""The rule that a fetch by name is answered from the tier only under the topic's current id at most a second old,
in process: a Metadata answer passing through (a client's, asked just before its first Fetch) counts as the
cluster naming the id, so that fetch asks nothing more; anything else is still asked of the cluster."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tierproxy.config import ProxySettings
from tierproxy.dev.ports import free_port
from tierproxy.remote.service import RemoteTier


def test_a_client_metadata_answer_makes_the_id_fresh_and_nothing_else_does(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"  # no broker: any question to the cluster fails

    async def go() -> None:
        tier = RemoteTier(ProxySettings(bootstrap_servers=nobody, storage=f"file://{tmp_path}/tier",
                                        metadata=f"file://{tmp_path}/meta"))
        try:
            tid = os.urandom(16)
            tier.learn_topic_ids([{"name": "orders", "topic_id": tid, "error_code": 0},
                                  {"name": "secret", "topic_id": tid, "error_code": 29}])
            assert await asyncio.wait_for(tier.refresh_topic_ids({"orders"}), 1) == {"orders"}
            assert tier.current_ids == {"orders": tid}
            with pytest.raises((OSError, ConnectionError)):  # refused for the client: still asked of the cluster
                await asyncio.wait_for(tier.refresh_topic_ids({"orders", "secret"}), 10)
            with pytest.raises((OSError, ConnectionError)):  # named longer ago than max_age (0: any age): asked again
                await asyncio.wait_for(tier.refresh_topic_ids({"orders"}, max_age=0.0), 10)
        finally:
            await tier.close()

    asyncio.run(go())
