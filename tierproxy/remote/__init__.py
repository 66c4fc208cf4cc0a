"""Remote fetch serving: Fetch, ListOffsets and OffsetForLeaderEpoch over the tiered range."""
