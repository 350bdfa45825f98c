#!/usr/bin/env python3
"""Time to first token through ragtime against the same backend called directly.

Closed loop: at each concurrency level, that many clients each send a question,
read the streamed answer to its end, and send the next, for --seconds. The
ragtime run asks `POST /v1/chat/completions` with `answer: generate`; the
direct run sends the backend the very prompts ragtime built (the backend's
--log), so both runs put the same work on the GPU. Prints one table row per
(level, path) and writes every request to --out.

TTFT is the time to the first chunk with text. Through ragtime, an answer the
model did not write (the backend was too slow or too busy: `partial_reason`
`llm_ttft`, `overload`, `llm_error` or `llm_unavailable`) is counted apart: its time is when the
extractive answer arrived.
"""

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

NOT_THE_MODEL = {"llm_ttft", "overload", "llm_error", "llm_unavailable"}


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def stream(session, url, body):
    t0 = time.perf_counter()
    first, last = None, {}
    async with session.post(url, json=body) as r:
        if r.status != 200:
            await r.read()
            return {"status": r.status, "ttft": None, "total": time.perf_counter() - t0}
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            c = json.loads(data)
            ch = c.get("choices") or []
            if first is None and ch and (ch[0].get("delta") or {}).get("content"):
                first = time.perf_counter() - t0
            last = c
    out = {"status": 200, "ttft": first, "total": time.perf_counter() - t0}
    if "partial_reason" in last or "budget" in last:
        out["partial_reason"] = last.get("partial_reason")
        stages = (last.get("budget") or {}).get("stages") or []
        out["stages"] = {s["stage"]: s["elapsed_ms"] for s in stages}
    return out


async def level(a, path, conc, questions, prompts):
    url = a.ragtime + "/v1/chat/completions" if path == "ragtime" else a.backend + "/v1/chat/completions"
    results, i = [], 0
    end = time.perf_counter() + a.seconds
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:

        async def client():
            nonlocal i
            while time.perf_counter() < end:
                k, i = i, i + 1
                if path == "ragtime":
                    q = questions[k % len(questions)]
                    body = {
                        "model": "ragtime",
                        "stream": True,
                        "messages": [{"role": "user", "content": q}],
                        "collection": a.collection,
                        "answer": "generate",
                    }
                else:
                    body = {
                        "model": a.model,
                        "stream": True,
                        "max_tokens": a.max_tokens,
                        "messages": prompts[k % len(prompts)],
                    }
                    if a.novel:
                        extra = " ".join(f"w{k}x{j}" for j in range(1 + k % 97))
                        last = dict(body["messages"][-1])
                        last["content"] = (last.get("content") or "") + " " + extra
                        body["messages"] = body["messages"][:-1] + [last]
                try:
                    results.append(await stream(s, url, body))
                except Exception as e:  # a broken request is a result too
                    results.append({"status": 0, "ttft": None, "error": repr(e)})

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(conc)))
        wall = time.perf_counter() - t0
    return results, wall


def summary(path, conc, results, wall):
    model = [r for r in results if r.get("ttft") is not None and r.get("partial_reason") not in NOT_THE_MODEL]
    other = [r for r in results if r.get("partial_reason") in NOT_THE_MODEL]
    ttft = [r["ttft"] * 1000 for r in model]
    reasons = {}
    for r in results:
        key = r.get("partial_reason") or ("ok" if r.get("status") == 200 else f"http {r.get('status')}")
        reasons[key] = reasons.get(key, 0) + 1
    pre = [r["stages"] for r in results if r.get("stages")]
    before_llm = [sum(v for k, v in st.items() if k in ("cache", "embed", "retrieve", "rerank")) for st in pre]
    return {
        "path": path,
        "concurrency": conc,
        "requests": len(results),
        "rps": len(results) / wall,
        "model_answers": len(model),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p95_ms": pct(ttft, 95),
        "ttft_p99_ms": pct(ttft, 99),
        "fallback_p95_ms": pct([r["total"] * 1000 for r in other], 95),
        "before_llm_mean_ms": statistics.fmean(before_llm) if before_llm else float("nan"),
        "outcomes": reasons,
    }


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ragtime", default="http://127.0.0.1:8080")
    p.add_argument("--backend", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="tinyllama-shape-random")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--queries", required=True, help="BEIR queries.jsonl")
    p.add_argument("--prompts", required=True, help="the backend's --log")
    p.add_argument("--collection", default="scifact")
    p.add_argument("--levels", default="1,4,16,48")
    p.add_argument("--only", choices=["ragtime", "direct"], help="one path, not both")
    p.add_argument(
        "--novel",
        action="store_true",
        help="direct: lengthen each replayed prompt by a few words, so that no prompt length repeats one the backend has seen",
    )
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--out", default="ttft.json")
    a = p.parse_args()
    questions = [json.loads(l)["text"] for l in open(a.queries)]
    rows, raw = [], []
    print("| path | clients | requests | req/s | model answers | TTFT p50 | p95 | p99 (ms) | before LLM (ms) | other outcomes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for conc in [int(x) for x in a.levels.split(",")]:
        for path in [a.only] if a.only else ["ragtime", "direct"]:
            prompts = [json.loads(l) for l in open(a.prompts)] if path == "direct" else []
            results, wall = await level(a, path, conc, questions, prompts)
            row = summary(path, conc, results, wall)
            rows.append(row)
            raw.append({"path": path, "concurrency": conc, "results": results})
            other = {k: v for k, v in row["outcomes"].items() if k != "ok"}
            print(
                f"| {path} | {conc} | {row['requests']} | {row['rps']:.1f} | {row['model_answers']} | "
                f"{row['ttft_p50_ms']:.0f} | {row['ttft_p95_ms']:.0f} | {row['ttft_p99_ms']:.0f} | "
                f"{row['before_llm_mean_ms']:.1f} | {other or ''} |",
                flush=True,
            )
    json.dump({"rows": rows, "raw": raw}, open(a.out, "w"))


if __name__ == "__main__":
    asyncio.run(main())
