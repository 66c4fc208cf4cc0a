"""Fetch over the tiered range: every Fetch goes to the broker; the tier answers only where the broker's answer
to *that* request is OFFSET_OUT_OF_RANGE.

Authorization: the broker authorizes each client request on the client's own connection, so a client without
READ (or whose ACL was removed a moment ago) gets the broker's TOPIC_AUTHORIZATION_FAILED and nothing from the
tier. Speed: a partition this connection already reads from the tier (`Session.tiered`: below the broker's local
log start) has its remote read started when the request arrives, in parallel with the broker's round trip
(`plan.plan_fetch` → `FetchPlan.remote`); its records are served only if the broker then says
OFFSET_OUT_OF_RANGE, otherwise the read is dropped (it only warmed the cache) and the partition forgotten. The
broker answers a request holding an out-of-range partition at once (`ReplicaManager`: an error completes the
fetch), so the speculation costs no wait. The answer is the broker's response with the tier's entries in place of
its OFFSET_OUT_OF_RANGE ones, spliced into its bytes (`answer.Spliced`: the other partitions' entries are copied, not
decoded and encoded again, so a fetch naming 10,000 partitions costs the tier's partitions, not all of them); a
response with NodeEndpoints to rewrite, or not in request order, is decoded and merged (`answer.merge_response`).
Either way the answer holds exactly the requested partitions.

Modules: `plan` (pure: the plan and the byte budget), `delayed` (`DelayedRemoteFetch`: reads, purgatory, gaps,
errors), `answer` (entries and the merge), `handler` (the request and response handlers).
Response fields: high watermark and last stable offset are the broker's; log start offset is the tier's start.
"""

from tierproxy.proxy.intercept.fetch.handler import fetch_request, fetch_response

__all__ = ["fetch_request", "fetch_response"]
