#!/usr/bin/env python3
"""The backend's own times per phase (scripts/gpu/backend.py --stats):
time to first token and decode time per token, for ragtime's requests and
for the direct ones, in the order the phases ran."""
import json
import sys

runs, bodies = [], {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    bodies.setdefault(r["client"], set()).add(json.dumps(r.get("body"), sort_keys=True))
    if runs and runs[-1][0] == r["client"]:
        runs[-1][1].append(r)
    else:
        runs.append((r["client"], [r]))
print("| phase | client | requests | backend TTFT p50 / p95 (ms) | decode ms/token p50 | prompt tokens p50 "
      "| engine: wait for prefill p50 (ms) | prefill p50 (ms) | requests open at prefill, mean | per decode step, mean |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for i, (client, rs) in enumerate(runs):
    # Engine figures come only with the requests the engine finished.
    def p(key, q):
        v = sorted(x[key] for x in rs if x.get(key) is not None)
        return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

    def mean(key):
        v = [x[key] for x in rs if x.get(key) is not None]
        return sum(v) / len(v) if v else float("nan")

    print(f"| {i} | {client} | {len(rs)} | {p('ttft_ms', .5):.0f} / {p('ttft_ms', .95):.0f} | "
          f"{p('decode_ms_per_token', .5):.1f} | {p('prompt_tokens', .5)} | {p('engine_queue_ms', .5):.1f} | "
          f"{p('engine_prefill_ms', .5):.1f} | {mean('engine_live_at_prefill'):.2f} | {mean('engine_mean_live'):.2f} |")
for client, b in bodies.items():
    print(f"{client} sent bodies (besides messages) like: {sorted(b)[:3]}")
