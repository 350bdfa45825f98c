#!/usr/bin/env python3
"""A GPU LLM backend for measuring ragtime's time to first token on a GPU.

No model hub is reachable from the GPU machine and at most 64 MiB travels to
it, so no trained model can be served there. This server runs a Llama-shaped
transformer (TinyLlama-1.1B's shape by default) with random weights in bf16 on
the GPU through PyTorch and `transformers`, and speaks the part of OpenAI's
streamed chat protocol ragtime uses. The answers are noise; the timings are a
real GPU's: prefill of the real prompt length, one forward pass per token.

Scheduling is iteration-level (see Engine): requests that arrive are prefilled
between two decode steps and stream at once. It is no vLLM (no paged KV cache,
one forward pass per group of arrivals, eager PyTorch), so its own times are
not vLLM's; the comparison that matters is ragtime's figures against this same
backend called directly with the same prompts (scripts/gpu/ttft.py).

Every prompt it is sent is appended to --log, so the direct runs replay the
prompts ragtime built.
"""

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections import deque

from aiohttp import web

SYLLABLES = "ba be bi bo bu da de di do du ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu ra re ri ro ru sa se si so su ta te ti to tu".split()


def word(tok: int) -> str:
    """A pronounceable word per token id, so the text is not one repeated token."""
    a, b = divmod(tok % (len(SYLLABLES) ** 2), len(SYLLABLES))
    return " " + SYLLABLES[a] + SYLLABLES[b]


def tokenize(text: str, vocab: int) -> list[int]:
    """About one token per four characters, as BPE tokenizers give on English."""
    ids = []
    for w in text.split():
        for i in range(0, len(w), 4):
            ids.append(hash(w[i : i + 4]) % (vocab - 1) + 1)
    return ids or [1]


class Request:
    """A request as the HTTP side sees it: its tokens arrive on `queue`."""

    def __init__(self, loop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Job:
    """A request as the engine sees it."""

    def __init__(self, rid, ids, max_new, arrived):
        self.rid, self.ids, self.max_new = rid, ids, max_new
        self.cancelled = False
        self.arrived = arrived  # perf_counter is CLOCK_MONOTONIC: one clock for both processes
        # What the engine saw of this request, sent back with its last
        # token: the wait for a prefill, the prefill's own time, and how
        # many requests shared the engine (at its prefill, and per decode
        # step on average).
        self.meta = {"queue_ms": 0.0, "prefill_ms": 0.0, "live_at_prefill": 0, "live_sum": 0, "steps": 0}


class Group:
    """Requests prefilled together, decoded together: one KV cache."""

    def __init__(self, reqs, past, mask, logits):
        self.reqs, self.past, self.mask, self.logits = reqs, past, mask, logits
        self.step = 0

    def live(self):
        return any(not r.cancelled and self.step < r.max_new for r in self.reqs)


class Engine:
    """Iteration-level scheduling, as vLLM does it in spirit: between two
    decode steps, the requests that arrived are prefilled (as one group with
    its own KV cache) and start streaming; each iteration then decodes one
    token for every group. A newcomer waits at most one iteration, not for
    the answers in flight to end. Up to --max-batch requests at once.

    It runs in a process of its own (as vLLM's engine core does): in the
    HTTP server's process, the GIL shared with the event loop slowed every
    decode step as the number of open streams grew."""

    def __init__(self, a, inq, outq):
        self.vocab = a.vocab
        self.max_batch = a.max_batch
        self.inq, self.outq = inq, outq
        self.waiting: deque[Job] = deque()
        self.jobs: dict[str, Job] = {}
        self.groups: list[Group] = []
        self.cpu_check = a.cpu_check
        self.sent: list = []
        if not a.cpu_check:
            self.load(a)

    def load(self, a):
        global torch
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.set_default_dtype(torch.bfloat16)
        cfg = LlamaConfig(
            vocab_size=a.vocab,
            hidden_size=a.hidden,
            intermediate_size=a.inter,
            num_hidden_layers=a.layers,
            num_attention_heads=a.heads,
            num_key_value_heads=a.kv_heads,
            max_position_embeddings=8192,
        )
        with torch.device("cuda"):
            self.model = LlamaForCausalLM(cfg).eval()

    def take(self, block):
        """Requests and cancellations that came in."""
        import queue

        while True:
            try:
                m = self.inq.get(block=block)
            except queue.Empty:
                return
            block = False
            if m[0] == "cancel":
                j = self.jobs.get(m[1])
                if j:
                    j.cancelled = True
            else:
                j = Job(*m[1:])
                self.jobs[j.rid] = j
                self.waiting.append(j)

    def run(self):
        if self.cpu_check:
            return self.loop()
        with torch.inference_mode():
            return self.loop()

    def loop(self):
        while True:
            self.take(block=not self.waiting and not self.groups)
            room = self.max_batch - sum(len(g.reqs) for g in self.groups)
            new = [self.waiting.popleft() for _ in range(min(max(room, 0), len(self.waiting)))]
            new = [r for r in new if not r.cancelled]
            try:
                if new:
                    self.groups.append(self.prefill(new))
                for g in self.groups:
                    self.decode(g)
            except Exception as e:  # report to every request, keep serving
                for g in self.groups:
                    for r in g.reqs:
                        self.sent.append((r.rid, repr(e)))
                for r in new:
                    self.sent.append((r.rid, repr(e)))
                self.groups = []
            if self.sent:
                self.outq.put(self.sent)
                self.sent = []
            self.groups = [g for g in self.groups if g.live()]
            live = {r.rid for g in self.groups for r in g.reqs} | {r.rid for r in self.waiting}
            self.jobs = {k: v for k, v in self.jobs.items() if k in live}

    def prefill(self, batch) -> Group:
        t = time.perf_counter()
        live = sum(len(g.reqs) for g in self.groups)
        for r in batch:
            r.meta["queue_ms"] = (t - r.arrived) * 1000
            r.meta["live_at_prefill"] = live
        if self.cpu_check:
            time.sleep(0.0002 * max(len(r.ids) for r in batch))
            group = Group(batch, None, None, None)
        else:
            group = self._prefill(batch)
            torch.cuda.synchronize()
        for r in batch:
            r.meta["prefill_ms"] = (time.perf_counter() - t) * 1000
        return group

    def _prefill(self, batch) -> Group:
        width = max(len(r.ids) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long, device="cuda")
        mask = torch.zeros((len(batch), width), dtype=torch.long, device="cuda")
        for i, r in enumerate(batch):  # left padding
            ids[i, width - len(r.ids) :] = torch.tensor(r.ids, device="cuda")
            mask[i, width - len(r.ids) :] = 1
        out = self.model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        return Group(batch, out.past_key_values, mask, out.logits[:, -1, :].float())

    def decode(self, g: Group):
        """Samples the group's next token, sends it, and runs the step that
        makes the one after (skipped once the group is done)."""
        if self.cpu_check:
            toks = [hash((id(r), g.step)) % self.vocab for r in g.reqs]
        else:
            tok = torch.multinomial(torch.softmax(g.logits, -1), 1)
            toks = tok.squeeze(1).tolist()  # waits for the GPU
        live = sum(1 for h in self.groups for r in h.reqs if not r.cancelled and h.step < r.max_new)
        for i, r in enumerate(g.reqs):
            if r.cancelled or g.step >= r.max_new:
                continue
            r.meta["live_sum"] += live
            r.meta["steps"] += 1
            self.sent.append((r.rid, toks[i]))
            if g.step + 1 == r.max_new:
                self.sent.append((r.rid, dict(r.meta)))
                self.sent.append((r.rid, None))
        g.step += 1
        if not g.live():
            return
        if self.cpu_check:
            time.sleep(0.01)
            return
        g.mask = torch.cat([g.mask, g.mask.new_ones((len(g.reqs), 1))], dim=1)
        out = self.model(input_ids=tok, attention_mask=g.mask, past_key_values=g.past, use_cache=True)
        g.past = out.past_key_values
        g.logits = out.logits[:, -1, :].float()


def chunk(rid, model, delta=None, finish=None, usage=None):
    c = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [] if usage else [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage:
        c["usage"] = usage
    return b"data: " + json.dumps(c).encode() + b"\n\n"


def engine_main(a, inq, outq):
    Engine(a, inq, outq).run()


def app(a) -> web.Application:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA does not survive fork
    inq, outq = ctx.Queue(), ctx.Queue()
    ctx.Process(target=engine_main, args=(a, inq, outq), daemon=True).start()
    open_reqs: dict[str, Request] = {}

    def dispatch():
        while True:
            for rid, item in outq.get():
                r = open_reqs.get(rid)
                if r:
                    r.put(RuntimeError(item) if isinstance(item, str) else item)

    threading.Thread(target=dispatch, daemon=True).start()
    log = open(a.log, "a") if a.log else None
    stats = open(a.stats, "a") if a.stats else None

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": a.model, "object": "model"}]})

    async def health(_):
        return web.json_response({"status": "ok", "open": len(open_reqs)})

    async def chat(req: web.Request):
        body = await req.json()
        messages = body.get("messages") or []
        if log:
            log.write(json.dumps(messages) + "\n")
            log.flush()
        text = "\n".join(m.get("content") or "" for m in messages)
        ids = tokenize(text, a.vocab)
        max_new = min(int(body.get("max_tokens") or a.max_new), a.max_new)
        t0 = time.perf_counter()
        r = Request(asyncio.get_running_loop())
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        rid = "chatcmpl-" + uuid.uuid4().hex[:12]
        open_reqs[rid] = r
        inq.put(("new", rid, ids, max_new, t0))
        n, first, last, meta = 0, None, None, {}
        try:
            await resp.write(chunk(rid, a.model, {"role": "assistant"}))
            while True:
                tok = await r.queue.get()
                if isinstance(tok, Exception):
                    raise tok
                if isinstance(tok, dict):
                    meta = tok
                    continue
                if tok is None:
                    break
                n += 1
                if n == 1:
                    first = time.perf_counter()
                last = time.perf_counter()
                await resp.write(chunk(rid, a.model, {"content": word(tok)}))
            await resp.write(chunk(rid, a.model, finish="length"))
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            await resp.write(chunk(rid, a.model, usage=usage))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:  # the caller went away: its tokens are not made
            return resp
        finally:
            open_reqs.pop(rid, None)
            inq.put(("cancel", rid))
            if stats and first is not None:  # the backend's own times
                line = {
                    "ttft_ms": (first - t0) * 1000,
                    "decode_ms_per_token": (last - first) * 1000 / max(n - 1, 1),
                    "tokens": n,
                    "prompt_tokens": len(ids),
                    "client": req.headers.get("user-agent", "").split("/")[0] or "ragtime",
                    "body": {k: v for k, v in body.items() if k != "messages"},
                    "at": time.time(),
                    "engine_queue_ms": meta.get("queue_ms"),
                    "engine_prefill_ms": meta.get("prefill_ms"),
                    "engine_live_at_prefill": meta.get("live_at_prefill"),
                    # Only a request the engine finished reports its meta.
                    "engine_mean_live": meta["live_sum"] / max(meta["steps"], 1) if meta else None,
                }
                stats.write(json.dumps(line) + "\n")
                stats.flush()
        return resp

    w = web.Application()
    w.router.add_get("/v1/models", models)
    w.router.add_get("/health", health)
    w.router.add_post("/v1/chat/completions", chat)
    return w


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="tinyllama-shape-random")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=5632)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-new", type=int, default=48, help="tokens per answer at most (random weights never stop)")
    p.add_argument("--log", default="", help="append every request's messages here")
    p.add_argument("--stats", default="", help="append each request's time to first token here")
    p.add_argument("--cpu-check", action="store_true", help="no GPU: sleep instead of running the model")
    a = p.parse_args()
    web.run_app(app(a), host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    main()
