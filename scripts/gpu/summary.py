#!/usr/bin/env python3
"""The backend's own times per phase (scripts/gpu/backend.py --stats):
time to first token and decode time per token, for ragtime's requests and
for the direct ones, in the order the phases ran."""
import json
import sys

runs = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if runs and runs[-1][0] == r["client"]:
        runs[-1][1].append(r)
    else:
        runs.append((r["client"], [r]))
print("| phase | client | requests | backend TTFT p50 / p95 (ms) | decode ms/token p50 | prompt tokens p50 |")
print("|---:|---|---:|---:|---:|---:|")
for i, (client, rs) in enumerate(runs):
    def p(key, q):
        v = sorted(x[key] for x in rs)
        return v[min(len(v) - 1, int(q * len(v)))]
    print(f"| {i} | {client} | {len(rs)} | {p('ttft_ms', .5):.0f} / {p('ttft_ms', .95):.0f} | "
          f"{p('decode_ms_per_token', .5):.1f} | {p('prompt_tokens', .5)} |")
