"""The remote tier: storage (RSM), segment metadata (RLMM) and indexes, after KIP-405."""
