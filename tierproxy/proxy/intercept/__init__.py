"""The intercepts: Fetch, ListOffsets, OffsetForLeaderEpoch and DeleteRecords handlers of the proxy core.

Each request is forwarded first (the broker authorizes it); the handlers decide from the broker's answer what
the remote tier (as `tierproxy.remote.view.RemoteTierView` names it) must add, and turn its results into Kafka answers.
"""
