#!/usr/bin/python3
"""export_gguf.py against a reader written here from the GGUF specification: a generated
tiny model (2 shards, bf16) exported to GGUF has the header, metadata and tensor table
llama.cpp's Llama loader reads, every tensor's bytes at an aligned offset, q and k rows
permuted per head into interleaved RoPE pairs, norms widened to f32, and refusals for what
it cannot export.

Usage: export_gguf_test.py MAKE_MODEL EXPORT_GGUF_PY
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
         11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.at:self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, vtype):
        if vtype in FIXED:
            return self.take(FIXED[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("<I"), self.take("<Q")
            return [self.value(etype) for _ in range(n)]
        raise ValueError(f"value type {vtype}")


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    assert data[:4] == b"GGUF", data[:4]
    r.at = 4
    assert r.take("<I") == 3
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    alignment = meta.get("general.alignment", 32)
    base = (r.at + alignment - 1) // alignment * alignment
    return data, meta, infos, base, alignment


def read_source(model_dir):
    """name -> (dtype, shape, raw bytes), from every safetensors file (independent of the
    exporter's reader)."""
    out = {}
    for name in os.listdir(model_dir):
        if not name.endswith(".safetensors"):
            continue
        data = open(os.path.join(model_dir, name), "rb").read()
        n = struct.unpack_from("<Q", data)[0]
        for key, e in json.loads(data[8:8 + n]).items():
            if key != "__metadata__":
                b, end = e["data_offsets"]
                out[key] = (e["dtype"], e["shape"], data[8 + n + b:8 + n + end])
    return out


def main():
    make_model, exporter = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "model")
    subprocess.run([make_model, "--shape=tiny", "--dtype=bf16", "--seed=5", "--shards=2",
                    f"--out={model}"], check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(work, "tiny.gguf")
    subprocess.run(["/usr/bin/python3", exporter, model, out], check=True,
                   stdout=subprocess.DEVNULL)
    cfg = json.load(open(os.path.join(model, "config.json")))
    data, meta, infos, base, alignment = read_gguf(out)
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    for key, want in [("general.architecture", "llama"),
                      ("llama.block_count", cfg["num_hidden_layers"]),
                      ("llama.embedding_length", cfg["hidden_size"]),
                      ("llama.feed_forward_length", cfg["intermediate_size"]),
                      ("llama.attention.head_count", heads),
                      ("llama.attention.head_count_kv", kv_heads),
                      ("llama.rope.dimension_count", head_dim),
                      ("llama.vocab_size", cfg["vocab_size"])]:
        check(meta.get(key) == want, f"{key}: {meta.get(key)} != {want}")
    check(abs(meta["llama.rope.freq_base"] - cfg["rope_theta"]) < 1e-3, "rope theta")
    check(abs(meta["llama.attention.layer_norm_rms_epsilon"] - cfg["rms_norm_eps"]) < 1e-9,
          "rms eps")
    check(len(meta["tokenizer.ggml.tokens"]) == cfg["vocab_size"], "token count")
    check(len(meta["tokenizer.ggml.scores"]) == cfg["vocab_size"], "score count")

    source = read_source(model)
    layers = cfg["num_hidden_layers"]
    expected = 2 + (0 if cfg.get("tie_word_embeddings") else 1) + 9 * layers
    check(len(infos) == expected, f"{len(infos)} tensors, expected {expected}")
    by_name = {name: (dims, t, off) for name, dims, t, off in infos}
    hf = {"token_embd.weight": "model.embed_tokens.weight",
          "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    parts = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(layers):
        for g, h in parts.items():
            hf[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{h}.weight"
    for name, (dims, gtype, offset) in by_name.items():
        dtype, shape, raw = source[hf[name]]
        check(dims == list(reversed(shape)), f"{name}: dims {dims} for shape {shape}")
        check(offset % alignment == 0, f"{name}: offset {offset} not aligned")
        src = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        if len(shape) == 1:
            check(gtype == 0, f"{name}: a norm must be f32, is type {gtype}")
            got = np.frombuffer(data, dtype=np.float32, count=shape[0], offset=base + offset)
            want = (src.astype(np.uint32) << 16).view(np.float32)
            check(np.array_equal(got, want), f"{name}: values")
            continue
        check(gtype == 30, f"{name}: bf16 must stay bf16, is type {gtype}")
        got = np.frombuffer(data, dtype=np.uint16, count=src.size,
                            offset=base + offset).reshape(shape)
        if ".attn_q." in name or ".attn_k." in name:
            n = heads if ".attn_q." in name else kv_heads
            half = head_dim // 2
            for h in range(n):
                for j in range(half):
                    for pair, row in ((0, j), (1, half + j)):
                        if not np.array_equal(got[h * head_dim + 2 * j + pair],
                                              src[h * head_dim + row]):
                            failures.append(f"{name}: head {h} row {2 * j + pair}")
        else:
            check(np.array_equal(got, src), f"{name}: bytes differ")

    # What it cannot export, it refuses.
    biased = os.path.join(work, "biased")
    shutil.copytree(model, biased)
    cfg["attention_bias"] = True
    json.dump(cfg, open(os.path.join(biased, "config.json"), "w"))
    r = subprocess.run(["/usr/bin/python3", exporter, biased, os.path.join(work, "b.gguf")],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "bias" in r.stderr, f"a biased model: {r.returncode} {r.stderr}")

    for f in failures[:20]:
        print("FAIL:", f)
    print(f"{len(infos)} tensors checked, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
