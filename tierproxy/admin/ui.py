"""The status page at `/ui`: every topic's partitions as a bar of the offset line (purged part, tier range with its
holes, gap, broker range, last stable offset, high watermark) with their numbers, and remote fetch activity that
refreshes itself. Server-rendered from the same models the JSON API answers with; a few lines of plain JavaScript
poll `/v1/remote-fetch` for the live figures. No build step, nothing loaded from elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from pydantic import BaseModel

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2733;background:#f7f8fa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 6px}.muted{color:#66717d}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:8px}
td,th{border:1px solid #dde2e8;padding:4px 6px;text-align:right;white-space:nowrap}th{background:#eef1f5}
td.bar-cell{width:38%;text-align:left}.bar{position:relative;height:16px;background:#eef1f5;border-radius:3px}
.bar span{position:absolute;top:0;bottom:0}
.purged{background:repeating-linear-gradient(45deg,#c9ced6 0 4px,#eef1f5 4px 8px)}
.tier{background:#3b7dd8}.hole{background:#f0a202}.gap{background:#d8433b}.broker{background:#43a35b;opacity:.8}
.lso{width:2px;background:#1d2733}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle}.live b{font-variant-numeric:tabular-nums}nav a{margin-right:12px}
"""

SCRIPT = """
let last = null;
async function refresh() {
  try {
    const r = await fetch("/v1/remote-fetch", {credentials: "same-origin"});
    if (!r.ok) return;
    const s = await r.json(), now = Date.now();
    for (const k of ["purgatory", "pool_running", "pool_queued", "rejected", "expired"]) {
      document.getElementById("rf-" + k).textContent = s[k];
    }
    document.getElementById("rf-cache").textContent =
      s.cache_hit_ratio === null ? "-" : (100 * s.cache_hit_ratio).toFixed(0) + "%";
    if (last) {
      const dt = (now - last.at) / 1000;
      document.getElementById("rf-req-rate").textContent = ((s.requests_total - last.requests_total) / dt).toFixed(1);
      document.getElementById("rf-mb-rate").textContent = ((s.bytes_total - last.bytes_total) / dt / 1e6).toFixed(2);
      document.getElementById("rf-err-rate").textContent = ((s.errors_total - last.errors_total) / dt).toFixed(2);
    }
    last = {...s, at: now};
  } catch (e) { /* the next poll tries again */ }
}
refresh();
setInterval(refresh, 2000);
"""

FIELDS = ("partition", "leader", "purged_below", "tier_start", "tier_end", "broker_log_start", "last_stable_offset",
          "high_watermark", "tiering_lag", "segments", "tier_bytes")


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def _bar(p: dict[str, Any]) -> str:
    """The partition's offset line, from offset 0 to its high watermark (or tier end)."""
    hi = max(x for x in (p["high_watermark"], p["tier_end"] + 1, p["purged_below"], 1) if x is not None)

    def span(cls: str, start: int, end: int, title: str) -> str:
        start, end = max(0, start), min(hi, end)
        if end <= start and cls != "lso":
            return ""
        left, width = 100 * start / hi, max(0.4, 100 * (end - start) / hi)
        return (f'<span class="{cls}" style="left:{left:.2f}%;width:{width:.2f}%" '
                f'title="{escape(title)}"></span>')

    parts = []
    if p["purged_below"] > 0:
        parts.append(span("purged", 0, p["purged_below"], f"purged below {p['purged_below']}"))
    if p["tier_start"] is not None and p["tier_end"] >= p["tier_start"]:
        parts.append(span("tier", p["tier_start"], p["tier_end"] + 1, f"tier {p['tier_start']}..{p['tier_end']}"))
    for a, b in p["holes"]:
        parts.append(span("hole", a, b, f"hole {a}..{b - 1} (refilled by the next pass)"))
    if p["gap"]:
        parts.append(span("gap", p["gap"][0], p["gap"][1] + 1, f"gap {p['gap'][0]}..{p['gap'][1]}: deleted "
                          "before it was tiered"))
    if p["broker_log_start"] is not None and p["high_watermark"] is not None:
        parts.append(span("broker", p["broker_log_start"], p["high_watermark"],
                          f"broker {p['broker_log_start']}..{p['high_watermark'] - 1}"))
    if p["last_stable_offset"] is not None:
        lso = min(p["last_stable_offset"], hi - 1)
        parts.append(f'<span class="lso" style="left:{100 * lso / hi:.2f}%" title="LSO '
                     f'{p["last_stable_offset"]}"></span>')
    return f'<div class="bar">{"".join(parts)}</div>'


def _partition_row(p: dict[str, Any]) -> str:
    cells = "".join(f'<td data-field="{f}">{_num(p[f])}</td>' for f in FIELDS)
    gap = f"{p['gap'][0]}..{p['gap'][1]}" if p["gap"] else ""
    holes = " ".join(f"{a}..{b - 1}" for a, b in p["holes"])
    return (f'<tr data-partition="{p["partition"]}">{cells}<td data-field="gap">{gap}</td>'
            f'<td data-field="holes">{holes}</td><td class="bar-cell">{_bar(p)}</td></tr>')


def render(topics: Sequence[tuple[BaseModel, Sequence[BaseModel]]], remote: BaseModel, ready: dict[str, Any]) -> str:
    """The whole page: `topics` as (TopicSummary, [PartitionStatus]) and `remote` a RemoteFetchStatus."""
    rf = remote.model_dump()
    ratio = "-" if rf["cache_hit_ratio"] is None else f"{100 * rf['cache_hit_ratio']:.0f}%"
    state = "ready" if ready["ready"] else "NOT READY: " + "; ".join(ready["problems"])
    head = "".join(f"<th>{f.replace('_', ' ')}</th>" for f in (*FIELDS, "gap", "holes", "offset line"))
    sections = []
    for summary, partitions in topics:
        t = summary.model_dump()
        retention = "forever" if t["tier_retention_ms"] < 0 else f"{t['tier_retention_ms']} ms"
        if t.get("restored_from_cluster"):
            retention += (f', restored from cluster {escape(t["restored_from_cluster"])} (history id '
                          f'{escape(t["history_topic_id"] or "")})')
        rows = "".join(_partition_row(p.model_dump()) for p in partitions)
        sections.append(
            f'<section data-topic="{escape(t["topic"])}"><h2>{escape(t["topic"])} '
            f'<span class="muted">{t["partitions"]} partitions, {t["tiered_segments"]} tiered segments, '
            f'{t["tiered_bytes"] / 1e6:.1f} MB, tier retention {retention}</span></h2>'
            f'<table><tr>{head}</tr>{rows}</table></section>')
    legend = "".join(f'<span class="{c}"></span>{label}' for c, label in (
        ("purged", "purged (DeleteRecords)"), ("tier", "tier"), ("hole", "hole"), ("gap", "gap"),
        ("broker", "broker"), ("lso", "LSO")))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tierproxy status</title><style>{CSS}</style></head>
<body><h1>tierproxy</h1><div class="muted">{escape(state)}</div>
<nav><a href="/v1/topics">/v1/topics</a><a href="/v1/remote-fetch">/v1/remote-fetch</a><a href="/metrics">/metrics</a>
<a href="/readyz">/readyz</a><a href="/docs">/docs</a></nav>
<h2>Remote fetch <span class="muted">(live)</span></h2>
<p class="live">requests/s <b id="rf-req-rate">-</b> · MB/s <b id="rf-mb-rate">-</b>
 · errors/s <b id="rf-err-rate">-</b> · purgatory <b id="rf-purgatory">{rf['purgatory']}</b>
 · pool <b id="rf-pool_running">{rf['pool_running']}</b>/{rf['pool_threads']} busy,
 <b id="rf-pool_queued">{rf['pool_queued']}</b> queued · rejected <b id="rf-rejected">{rf['rejected']}</b>
 · expired <b id="rf-expired">{rf['expired']}</b> · cache hit ratio <b id="rf-cache">{ratio}</b></p>
<p class="legend muted">{legend}</p>
{''.join(sections) or '<p class="muted">no topics</p>'}
<script>{SCRIPT}</script></body></html>"""


def login_page(message: str = "") -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tierproxy status: token</title><style>{CSS}</style></head>
<body><h1>tierproxy</h1><p class="muted">{escape(message) or 'This admin API needs its token (admin.token).'}</p>
<form method="post" action="/ui/login"><input type="password" name="token" autofocus>
<button type="submit">open</button></form></body></html>"""
