#!/usr/bin/python3
"""Checks strata's forward pass against the numpy reference on one model.

Runs forward_dump (prompt + 8 greedy decode steps), then the reference, teacher-forced on
the same tokens, and compares the log-softmax at each recorded position:
  - the top-1 token is equal, unless the reference itself has a tie at bf16 precision there
    (its logprobs of the two tokens within 0.01), which is reported;
  - max |delta| <= 0.05 over the reference's top-10 tokens;
  - ||delta|| / ||ref|| <= 1e-2 over the whole vocabulary.
Usage: compare_forward.py FORWARD_DUMP MODEL_DIR WORK_DIR [forward_dump flags...]
(--kv_cache_dtype=f16 among them rounds the reference's KV cache to f16 as well.)
Prints one line per position and exits non-zero on any violation.
"""
import json
import subprocess
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from llama_reference import ReferenceModel  # noqa: E402


def main():
    dump, model_dir, work = sys.argv[1], sys.argv[2], sys.argv[3]
    extra = sys.argv[4:]
    prefix = f"{work}/dump"
    subprocess.run([dump, f"--model={model_dir}", f"--out={prefix}"] + extra, check=True)
    with open(prefix + ".json") as f:
        meta = json.load(f)
    got = np.load(prefix + ".npy").astype(np.float64)
    kv_dtype = "bf16"
    for flag in extra:
        if flag.startswith("--kv_cache_dtype="):
            kv_dtype = flag.split("=", 1)[1]
    ref_all = ReferenceModel(model_dir, kv_dtype).log_softmax(meta["tokens"])
    ok = True
    worst_max = worst_rel = 0.0
    for i, pos in enumerate(meta["positions"]):
        ref = ref_all[pos]
        mine = got[i]
        top10 = np.argsort(-ref, kind="stable")[:10]
        max_delta = float(np.max(np.abs(mine[top10] - ref[top10])))
        rel = float(np.linalg.norm(mine - ref) / np.linalg.norm(ref))
        mine_top1, ref_top1 = int(np.argmax(mine)), int(np.argmax(ref))
        tie = mine_top1 != ref_top1 and ref[ref_top1] - ref[mine_top1] <= 0.01
        top1_ok = mine_top1 == ref_top1 or tie
        margin = float(ref[top10[0]] - ref[top10[1]])
        worst_max, worst_rel = max(worst_max, max_delta), max(worst_rel, rel)
        verdict = "tie" if tie else ("ok " if top1_ok else "BAD")
        line = (f"pos {pos:4d}: top1 {verdict} (ref margin {margin:.3f}) "
                f"max|d| top10 {max_delta:.2e} rel {rel:.2e}")
        print(line)
        if not top1_ok or max_delta > 0.05 or rel > 1e-2:
            ok = False
    print(f"worst: max|d| {worst_max:.2e} (limit 5e-2), rel {worst_rel:.2e} (limit 1e-2)")
    if kv_dtype != "bf16":
        # The KV cache's type must show: strata is nearer the reference that rounds K and V
        # as it was asked to than the one that rounds them to bf16.
        other = ReferenceModel(model_dir, "bf16").log_softmax(meta["tokens"])
        rows = meta["positions"]
        own = float(np.linalg.norm(got - ref_all[rows]))
        bf16 = float(np.linalg.norm(got - other[rows]))
        print(f"distance to the {kv_dtype}-KV reference {own:.3e}, to the bf16-KV one {bf16:.3e}")
        if not own < bf16:
            print(f"BAD: nearer the bf16-KV reference than the {kv_dtype}-KV one")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
