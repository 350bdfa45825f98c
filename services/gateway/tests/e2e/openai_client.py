"""Asks ragtime a question through the official OpenAI Python client,
streamed and not, then streamed in each answer mode (ragtime's `answer`
field), and prints what came back as one JSON line.

    python3 openai_client.py BASE_URL COLLECTION QUESTION
"""
import json
import sys
import time

import openai

base, collection, question = sys.argv[1:4]
client = openai.OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0)
model = client.models.list().data[0].id
extra = {"collection": collection, "top_k": 3}
messages = [{"role": "user", "content": question}]

t0 = time.monotonic()
ttft = None
text = ""
last = None
stream = client.chat.completions.create(
    model=model, messages=messages, stream=True, max_tokens=48, temperature=0, extra_body=extra
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        if ttft is None:
            ttft = time.monotonic() - t0
        text += chunk.choices[0].delta.content
    if chunk.choices and chunk.choices[0].finish_reason:
        last = chunk
extras = last.model_extra or {}

full = client.chat.completions.create(
    model=model, messages=messages, max_tokens=48, temperature=0, extra_body=extra
)

def in_mode(answer):
    """A streamed answer in one answer mode: its text and last chunk's fields."""
    body = dict(extra, answer=answer)
    text, last = "", None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, stream=True, max_tokens=48, extra_body=body
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.choices and chunk.choices[0].finish_reason:
            last = chunk
    x = last.model_extra or {}
    return {"text": text, **{k: x.get(k) for k in
            ("answer", "grounding", "partial", "partial_reason", "citations", "budget")}}


modes = {m: in_mode(m) for m in ("generate", "extractive", "quote_then_generate")}

print(json.dumps({
    "modes": modes,
    "model": model,
    "stream": {
        "text": text,
        "ttft_s": ttft,
        "finish_reason": last.choices[0].finish_reason,
        "citations": extras.get("citations"),
        "partial": extras.get("partial"),
        "partial_reason": extras.get("partial_reason"),
        "cached": extras.get("cached"),
        "budget": extras.get("budget"),
    },
    "full": {
        "text": full.choices[0].message.content,
        "finish_reason": full.choices[0].finish_reason,
        "citations": (full.model_extra or {}).get("citations"),
        "cached": (full.model_extra or {}).get("cached"),
        "usage": full.usage.model_dump() if full.usage else None,
    },
}))
