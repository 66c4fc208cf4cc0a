"""The intercepts: Fetch, ListOffsets and OffsetForLeaderEpoch handlers of the proxy core.

Each request is forwarded first (the broker authorizes it); the handlers decide from the broker's answer what
the remote tier (`tierproxy.remote.RemoteTier`, a service) must add, and turn its results into Kafka answers.
"""
