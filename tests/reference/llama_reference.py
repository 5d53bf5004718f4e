#!/usr/bin/python3
"""An independent reference forward pass for Llama, Mistral and Qwen2 checkpoints, in numpy.

Written from the model equations (RMSNorm, rotary embedding in the rotate-half form with
linear / llama3 frequency scaling, grouped-query causal softmax attention, SwiGLU MLP), not
from strata's C++. It models serving the checkpoint in bfloat16: weight matrices
(projections, embeddings, head) are rounded to bf16, f16 and f32 checkpoints included,
while norm weights and biases keep their stored precision; and values are rounded to bf16
where a bf16 engine stores them: every matmul input, q/k/v after RoPE (the KV cache) and
the attention output; with kv_dtype="f16", k and v (the KV cache) are rounded to IEEE
binary16 instead. Everything else is float64.

Usage as a library: ReferenceModel(model_dir[, kv_dtype]).log_softmax(tokens) ->
[len(tokens), vocab].
"""
import json
import math
import os
import struct

import numpy as np


def bf16_round(x):
    """Round to the nearest bfloat16 (ties to even), returned as float64."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def f16_round(x):
    """Round to the nearest IEEE binary16 (ties to even, overflow to infinity), as float64."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def safetensors_files(model_dir):
    """The checkpoint's safetensors files: the shards its index names, or the one file."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    return [os.path.join(model_dir, name) for name in files]


def read_safetensors_raw(path):
    """name -> (dtype name, shape, the stored little-endian bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        tensors[name] = (entry["dtype"], entry["shape"], data[base + begin: base + end])
    return tensors


def read_safetensors(path):
    tensors = {}
    for name, (dtype, shape, raw) in read_safetensors_raw(path).items():
        if dtype == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype=np.float16)
        elif dtype == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {dtype}")
        arr = arr.astype(np.float64).reshape(shape)
        tensors[name] = bf16_round(arr) if arr.ndim == 2 else arr
    return tensors


def load_weights(model_dir):
    weights = {}
    for path in safetensors_files(model_dir):
        weights.update(read_safetensors(path))
    return weights


def inverse_frequencies(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = np.array([theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)])
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling["factor"]
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = scaling.get("low_freq_factor", 1.0)
        high = scaling.get("high_freq_factor", 4.0)
        original = scaling.get("original_max_position_embeddings", 8192)
        out = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < original / high:
                out.append(f)
            elif wavelength > original / low:
                out.append(f / factor)
            else:
                t = (original / wavelength - low) / (high - low)
                out.append((1 - t) * f / factor + t * f)
        return np.array(out)
    raise ValueError(f"unsupported rope scaling {kind}")


class ReferenceModel:
    def __init__(self, model_dir, kv_dtype="bf16"):
        if kv_dtype not in ("bf16", "f16"):
            raise ValueError(f"KV dtype {kv_dtype}: bf16 or f16")
        self.kv_round = f16_round if kv_dtype == "f16" else bf16_round
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        c = self.cfg
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.layers = c["num_hidden_layers"]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.w = load_weights(model_dir)
        self.inv_freq = inverse_frequencies(c, self.head_dim)

    def rms_norm(self, x, weight):
        inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return x * inv * weight

    def rope(self, x, positions):
        # x: [tokens, heads, head_dim]; pairs (i, i + head_dim/2) rotate by pos * inv_freq[i].
        half = self.head_dim // 2
        angle = positions[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def linear(self, x, name, bias=None):
        y = bf16_round(x) @ self.w[name].T
        if bias is not None and bias in self.w:
            y = y + self.w[bias]
        return y

    def log_softmax(self, tokens):
        tokens = np.asarray(tokens)
        n = len(tokens)
        positions = np.arange(n, dtype=np.float64)
        x = self.w["model.embed_tokens.weight"][tokens].copy()
        group = self.heads // self.kv_heads
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self.linear(h, p + "self_attn.q_proj.weight", p + "self_attn.q_proj.bias")
            k = self.linear(h, p + "self_attn.k_proj.weight", p + "self_attn.k_proj.bias")
            v = self.linear(h, p + "self_attn.v_proj.weight", p + "self_attn.v_proj.bias")
            q = bf16_round(self.rope(q.reshape(n, self.heads, self.head_dim), positions))
            k = self.kv_round(self.rope(k.reshape(n, self.kv_heads, self.head_dim), positions))
            v = self.kv_round(v.reshape(n, self.kv_heads, self.head_dim))
            out = np.empty((n, self.heads, self.head_dim))
            for head in range(self.heads):
                kv = head // group
                scores = q[:, head, :] @ k[:, kv, :].T / math.sqrt(self.head_dim) + mask
                scores -= scores.max(axis=1, keepdims=True)
                probs = np.exp(scores)
                probs /= probs.sum(axis=1, keepdims=True)
                out[:, head, :] = probs @ v[:, kv, :]
            x = x + self.linear(out.reshape(n, -1), p + "self_attn.o_proj.weight")
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(h, p + "mlp.gate_proj.weight")
            up = self.linear(h, p + "mlp.up_proj.weight")
            act = gate / (1.0 + np.exp(-gate)) * up
            x = x + self.linear(act, p + "mlp.down_proj.weight")
        h = self.rms_norm(x, self.w["model.norm.weight"])
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        logits = bf16_round(h) @ head.T
        logits -= logits.max(axis=-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
