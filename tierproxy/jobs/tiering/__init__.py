"""The tiering pipeline (`tierproxy tier`): copy closed data to the tier, retention, deletion, gap alarms."""
