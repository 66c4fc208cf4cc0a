"""The minimal ACLs of docs/proxy.md "Secured clusters", applied with the admin API (on the internal listener)."""

from __future__ import annotations

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

ALLOW = AclPermissionType.ALLOW


def _binding(principal: str, rtype: ResourceType, name: str, op: AclOperation,
             pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, f"User:{principal}", "*", op, ALLOW)


def tierproxy_acls(principal: str, topics: list[str], metadata_topic: str) -> list[AclBinding]:
    """What `tierproxy serve` and `tierproxy tier` need, and nothing more (docs/proxy.md "Secured clusters")."""
    out = []
    for t in topics:  # tiered topics: fetch (READ), offsets and metadata (DESCRIBE), retention (DESCRIBE_CONFIGS)
        for op in (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS):
            out.append(_binding(principal, ResourceType.TOPIC, t, op))
    for op in (AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE,
               AclOperation.DESCRIBE_CONFIGS):  # the metadata topic
        out.append(_binding(principal, ResourceType.TOPIC, metadata_topic, op))
    out.append(_binding(principal, ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE))
    for op in (AclOperation.WRITE, AclOperation.DESCRIBE):  # the tier job's fenced (transactional) writes
        out.append(_binding(principal, ResourceType.TRANSACTIONAL_ID, f"tierproxy-tier-{metadata_topic}", op))
    return out


def restore_acls(principal: str, topics: list[str], metadata_topic: str) -> list[AclBinding]:
    """What `tierproxy restore` needs but READ on the groups (docs/restore.md, step 1): CREATE and
    ALTER on the cluster, WRITE and DELETE on the restored topics, and what `tier` needs."""
    out = tierproxy_acls(principal, topics, metadata_topic)
    for op in (AclOperation.CREATE, AclOperation.ALTER):
        out.append(_binding(principal, ResourceType.BROKER, "kafka-cluster", op))
    for t in topics:
        for op in (AclOperation.WRITE, AclOperation.DELETE):
            out.append(_binding(principal, ResourceType.TOPIC, t, op))
    return out


def group_acls(principal: str, group: str) -> list[AclBinding]:
    """READ on one group (its offsets)."""
    return [_binding(principal, ResourceType.GROUP, group, AclOperation.READ)]


def reader_acls(principal: str, topic: str) -> list[AclBinding]:
    """A consumer: READ on the topic and on its groups (prefixed with its name)."""
    return [_binding(principal, ResourceType.TOPIC, topic, AclOperation.READ),
            _binding(principal, ResourceType.GROUP, principal, AclOperation.READ, ResourcePatternType.PREFIXED)]


def create_acls(admin_bootstrap: str, bindings: list[AclBinding]) -> None:
    admin = AdminClient({"bootstrap.servers": admin_bootstrap})
    for fut in admin.create_acls(bindings, request_timeout=30).values():
        fut.result(30)


def delete_acls(admin_bootstrap: str, bindings: list[AclBinding]) -> None:
    admin = AdminClient({"bootstrap.servers": admin_bootstrap})
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                b.permission_type) for b in bindings]
    for fut in admin.delete_acls(filters, request_timeout=30).values():
        fut.result(30)
