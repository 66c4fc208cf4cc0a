"""Fetch over the tiered range: every Fetch goes to the broker; the tier answers only where the broker's answer
to *that* request is OFFSET_OUT_OF_RANGE.

Authorization: the broker authorizes each client request on the client's own connection, so a client without
READ (or whose ACL was removed a moment ago) gets the broker's TOPIC_AUTHORIZATION_FAILED and nothing from the
tier. Speed: a partition this connection already reads from the tier (`Session.tiered`: below the broker's local
log start) has its remote read started when the request arrives, in parallel with the broker's round trip
(`plan.plan_fetch` → `FetchPlan.remote`); its records are served only if the broker then says
OFFSET_OUT_OF_RANGE, otherwise the read is dropped (it only warmed the cache) and the partition forgotten. The
broker answers a request holding an out-of-range partition at once (`ReplicaManager`: an error completes the
fetch), so the speculation costs no wait. The answers are merged into one response holding exactly the requested
partitions, in request order (`answer.merge_response`).

Modules: `plan` (pure: the plan and the byte budget), `delayed` (`DelayedRemoteFetch`: reads, purgatory, gaps,
errors), `answer` (entries and the merge), `handler` (the request and response handlers).
Response fields: high watermark and last stable offset are the broker's; log start offset is the tier's start.
"""

from tierproxy.proxy.intercept.fetch.handler import fetch_request, fetch_response

__all__ = ["fetch_request", "fetch_response"]
