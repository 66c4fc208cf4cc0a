"""Open the RLMM a `--metadata` URI names: the metadata topic on the upstream cluster (default) or a file."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tierproxy.config.identity import ClientIdentity
from tierproxy.config.identity.clients import aiokafka_options
from tierproxy.tier.rlmm import RemoteLogMetadataManager
from tierproxy.tier.rlmm_file import FileRLMM
from tierproxy.tier.rlmm_topic import DEFAULT_TOPIC, TopicRLMM


def open_metadata(uri: str | None, bootstrap: str, checkpoint_dir: Path | None = None,
                  identity: ClientIdentity | None = None, writer: bool = False) -> RemoteLogMetadataManager:
    """`None` or `topic:` → the default metadata topic; `topic:NAME?partitions=N&replication=R`; `file:///dir`.
    `identity`: tierproxy's own (`--command-config`) for the metadata topic's clients. `writer`: the tier job's
    view, fenced against a second job (`WriterFenced`)."""
    options = aiokafka_options(identity)
    if uri is None or uri in ("topic", "topic:"):
        return TopicRLMM(bootstrap, checkpoint_dir=checkpoint_dir, client_options=options, writer=writer)
    u = urlparse(uri)
    if u.scheme == "file":
        return FileRLMM(Path(u.path), writer=writer)
    if u.scheme == "topic":
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        return TopicRLMM(bootstrap, topic=u.path or u.netloc or DEFAULT_TOPIC,
                         partitions=int(q.get("partitions", 50)),
                         replication=int(q["replication"]) if "replication" in q else None,
                         audit_topic=q.get("audit"), checkpoint_dir=checkpoint_dir, client_options=options,
                         writer=writer)
    raise ValueError(f"unsupported metadata URI {uri!r}: use topic:[NAME] or file:///dir")
