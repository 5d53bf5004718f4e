#!/usr/bin/python3
"""Writes a strata model directory (Llama architecture, safetensors) as one GGUF file, so
that llama.cpp can run the identical weights (tests/bench/peer_bench.py).

Usage: export_gguf.py MODEL_DIR [OUT.gguf]   (default: MODEL_DIR/model.gguf)

What it writes (GGUF version 3, llama.cpp's "llama" architecture):
  - 2-D weights as they are stored (bf16 stays bf16, f16 stays f16, f32 stays f32); 1-D
    weights (the norms) as f32, which llama.cpp's CPU backend expects.
  - q_proj and k_proj rows permuted per head from the rotate-half RoPE layout of Hugging
    Face checkpoints to the interleaved pairs llama.cpp rotates: row 2i of a head is row i,
    row 2i+1 is row head_dim/2 + i.
  - The shape and RoPE settings from config.json (no scaling or linear scaling; llama3
    scaling and attention biases are refused: the benchmark's demo model has neither).
  - The vocabulary of tokenizer.json when it is a byte-fallback BPE in the SentencePiece
    style (tokenizer.ggml.model "llama"), scores from the token order; otherwise
    placeholder tokens, which is enough for benchmarks that send token ids.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import llama_reference  # noqa: E402  (its safetensors reader: bytes as stored)

ALIGNMENT = 32
# GGUF value types.
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
# ggml tensor types.
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
DTYPES = {"F32": (GGML_F32, np.float32), "F16": (GGML_F16, np.float16),
          "BF16": (GGML_BF16, np.uint16)}


def read_tensors(model_dir):
    """name -> (dtype name, shape, raw little-endian bytes), over every shard."""
    out = {}
    for path in llama_reference.safetensors_files(model_dir):
        out.update(llama_reference.read_safetensors_raw(path))
    return out


def permute_rope_rows(raw, dtype, shape, heads):
    """Rotate-half rows to interleaved pairs, per head (llama.cpp's Llama layout)."""
    arr = np.frombuffer(raw, dtype=DTYPES[dtype][1]).reshape(shape)
    rows, cols = shape
    head_dim = rows // heads
    arr = arr.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    return np.ascontiguousarray(arr).tobytes()


def to_f32(raw, dtype):
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).tobytes()
    return np.frombuffer(raw, dtype=DTYPES[dtype][1]).astype(np.float32).tobytes()


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, value):
    if vtype == UINT32:
        return struct.pack("<I", value)
    if vtype == INT32:
        return struct.pack("<i", value)
    if vtype == FLOAT32:
        return struct.pack("<f", value)
    if vtype == BOOL:
        return struct.pack("<?", value)
    if vtype == STRING:
        return gguf_string(value)
    raise ValueError(vtype)


def gguf_kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == FLOAT32:
            return out + np.asarray(items, dtype="<f4").tobytes()
        if etype == INT32:
            return out + np.asarray(items, dtype="<i4").tobytes()
        return out + b"".join(gguf_value(etype, v) for v in items)
    return out + gguf_value(vtype, value)


def vocabulary(model_dir, vocab_size):
    """(tokens, scores, types) for tokenizer.ggml.model "llama"."""
    tokens = [f"<tok_{i}>" for i in range(vocab_size)]
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(path):
        with open(path) as f:
            model = json.load(f).get("model", {})
        if model.get("type") == "BPE" and model.get("byte_fallback"):
            for text, i in model["vocab"].items():
                if i < vocab_size:
                    tokens[i] = text
    types = []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(2)  # unknown
        elif t in ("<s>", "</s>"):
            types.append(3)  # control
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(6)  # byte
        else:
            types.append(1)  # normal
    scores = [-float(i) for i in range(vocab_size)]
    return tokens, scores, types


def export(model_dir, out_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type", "llama") not in ("llama", "mistral"):
        raise SystemExit(f"{model_dir}: model_type {cfg.get('model_type')}: only Llama-style models")
    if cfg.get("attention_bias"):
        raise SystemExit(f"{model_dir}: attention biases are not exported")
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "linear"):
        raise SystemExit(f"{model_dir}: rope scaling {kind} is not exported")
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", hidden // heads)
    layers = cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings", False)

    src = read_tensors(model_dir)
    names = [("model.embed_tokens.weight", "token_embd.weight", None),
             ("model.norm.weight", "output_norm.weight", None)]
    if not tied:
        names.append(("lm_head.weight", "output.weight", None))
    for i in range(layers):
        p, q = f"model.layers.{i}.", f"blk.{i}."
        names += [(p + "input_layernorm.weight", q + "attn_norm.weight", None),
                  (p + "self_attn.q_proj.weight", q + "attn_q.weight", heads),
                  (p + "self_attn.k_proj.weight", q + "attn_k.weight", kv_heads),
                  (p + "self_attn.v_proj.weight", q + "attn_v.weight", None),
                  (p + "self_attn.o_proj.weight", q + "attn_output.weight", None),
                  (p + "post_attention_layernorm.weight", q + "ffn_norm.weight", None),
                  (p + "mlp.gate_proj.weight", q + "ffn_gate.weight", None),
                  (p + "mlp.up_proj.weight", q + "ffn_up.weight", None),
                  (p + "mlp.down_proj.weight", q + "ffn_down.weight", None)]
    tensors = []  # (gguf name, ggml type, shape in torch order, bytes)
    for hf, gg, permute_heads in names:
        if hf not in src:
            raise SystemExit(f"{model_dir}: no tensor {hf}")
        dtype, shape, raw = src[hf]
        if dtype not in DTYPES:
            raise SystemExit(f"{model_dir}: {hf}: dtype {dtype}")
        if len(shape) == 1:
            tensors.append((gg, GGML_F32, shape, to_f32(raw, dtype)))
            continue
        if permute_heads is not None:
            raw = permute_rope_rows(raw, dtype, shape, permute_heads)
        tensors.append((gg, DTYPES[dtype][0], shape, raw))

    tokens, scores, types = vocabulary(model_dir, vocab)
    kvs = [
        gguf_kv("general.architecture", STRING, "llama"),
        gguf_kv("general.name", STRING, os.path.basename(os.path.normpath(model_dir))),
        gguf_kv("general.alignment", UINT32, ALIGNMENT),
        gguf_kv("llama.context_length", UINT32, cfg.get("max_position_embeddings", 4096)),
        gguf_kv("llama.embedding_length", UINT32, hidden),
        gguf_kv("llama.block_count", UINT32, layers),
        gguf_kv("llama.feed_forward_length", UINT32, cfg["intermediate_size"]),
        gguf_kv("llama.attention.head_count", UINT32, heads),
        gguf_kv("llama.attention.head_count_kv", UINT32, kv_heads),
        gguf_kv("llama.attention.key_length", UINT32, head_dim),
        gguf_kv("llama.attention.value_length", UINT32, head_dim),
        gguf_kv("llama.rope.dimension_count", UINT32, head_dim),
        gguf_kv("llama.rope.freq_base", FLOAT32, float(cfg.get("rope_theta", 10000.0))),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", FLOAT32,
                float(cfg.get("rms_norm_eps", 1e-6))),
        gguf_kv("llama.vocab_size", UINT32, vocab),
        gguf_kv("tokenizer.ggml.model", STRING, "llama"),
        gguf_kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        gguf_kv("tokenizer.ggml.scores", ARRAY, (FLOAT32, scores)),
        gguf_kv("tokenizer.ggml.token_type", ARRAY, (INT32, types)),
        gguf_kv("tokenizer.ggml.bos_token_id", UINT32, cfg.get("bos_token_id", 1)),
        gguf_kv("tokenizer.ggml.eos_token_id", UINT32,
                cfg.get("eos_token_id", 2) if isinstance(cfg.get("eos_token_id", 2), int)
                else cfg["eos_token_id"][0]),
        gguf_kv("tokenizer.ggml.unknown_token_id", UINT32, 0),
        gguf_kv("tokenizer.ggml.add_bos_token", BOOL, False),
    ]
    if kind == "linear":
        kvs += [gguf_kv("llama.rope.scaling.type", STRING, "linear"),
                gguf_kv("llama.rope.scaling.factor", FLOAT32, float(scaling["factor"]))]

    infos = b""
    offset = 0
    for name, gtype, shape, raw in tensors:
        dims = list(reversed(shape))  # ne[0] is the innermost dimension
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", gtype, offset)
        offset += (len(raw) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(b"\0" * ((-len(header)) % ALIGNMENT))
        for _, _, _, raw in tensors:
            f.write(raw)
            f.write(b"\0" * ((-len(raw)) % ALIGNMENT))
    os.replace(tmp, out_path)
    return out_path


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(model_dir, "model.gguf")
    print(export(model_dir, out))


if __name__ == "__main__":
    main()
