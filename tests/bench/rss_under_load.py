#!/usr/bin/python3
"""Compute-node memory under repeated overload: starts the launcher's default deployment (demo
model, 2 memory nodes), sends ROUNDS rounds of 200 concurrent completions of varied prompt
lengths and n, and prints the compute node's RSS and its cached oneDNN primitives
(strata_compute_node_gemm_primitives) at idle after each round.

  /usr/bin/python3 tests/bench/rss_under_load.py "$(bazel info bazel-bin)" ROUNDS [launcher flags]
"""
import json, os, re, subprocess, sys, threading, time, urllib.request
bin_dir = sys.argv[1]; rounds = int(sys.argv[2])
port_file = '/tmp/rss-ports.json'
if os.path.exists(port_file): os.remove(port_file)
p = subprocess.Popen([bin_dir + '/deploy/local/launcher', '--bin_dir=' + bin_dir, '--port=0', '--grpc_port=-1',
                      '--port_file=' + port_file, '--restart_nodes=false'] + sys.argv[3:],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not os.path.exists(port_file): time.sleep(0.5)
info = json.load(open(port_file)); port = info['http']; pid = info['pids']['compute-0']; mport = info['metrics']['compute-0']
def rss():
    for line in open(f'/proc/{pid}/status'):
        if line.startswith('VmRSS'): return int(line.split()[1]) // 1024
def prims():
    t = urllib.request.urlopen(f'http://127.0.0.1:{mport}/metrics').read().decode()
    m = re.search(r'strata_compute_node_gemm_primitives\{[^}]*\} (\S+)', t)
    return int(float(m.group(1))) if m else -1
def one(i):
    body = json.dumps({"model": "demo", "prompt": "Once upon a time " * (1 + i % 20), "max_tokens": 64, "ignore_eos": True, "n": 1 + i % 3}).encode()
    try: urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{port}/v1/completions', body, {'Content-Type': 'application/json'}), timeout=300).read()
    except Exception: pass
print('idle: RSS', rss(), 'MiB, primitives', prims(), flush=True)
for r in range(rounds):
    ts = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    [t.start() for t in ts]; [t.join() for t in ts]
    time.sleep(2)
    print('after round', r + 1, ': RSS', rss(), 'MiB, primitives', prims(), flush=True)
p.terminate(); p.wait()
