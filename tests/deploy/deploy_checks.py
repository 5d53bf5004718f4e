"""Checks of the deployment artifacts (run by //tests/deploy tests, with /usr/bin/python3).

  deploy_checks.py k8s ROOT       render deploy/k8s overlays with `kubectl kustomize` and check
                                  what operators rely on (see check_k8s)
  deploy_checks.py grafana ROOT   every dashboard panel's PromQL, as recording rules, passes
                                  `promtool check rules`
  deploy_checks.py image ROOT BIN...  the Dockerfile's runtime packages provide every shared
                                  library the binaries link (ldd + dpkg -S)
Exit status 0 when every check passes; each failure is printed.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
        print("FAIL:", message)
    return ok


def render(root, overlay):
    # kustomize will not read through symlinks (as Bazel's runfiles are): render a copy.
    copy = os.path.join(tempfile.mkdtemp(), "deploy")
    if not os.path.exists(copy):
        shutil.copytree(os.path.join(root, "deploy"), copy, ignore=shutil.ignore_patterns("local"))
    out = subprocess.run(["kubectl", "kustomize", os.path.join(copy, "k8s/overlays", overlay)],
                         capture_output=True, text=True)
    if not check(out.returncode == 0, f"{overlay}: kubectl kustomize failed: {out.stderr[-2000:]}"):
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def check_workloads(overlay, docs):
    deployments, statefulsets = by_kind(docs, "Deployment"), by_kind(docs, "StatefulSet")
    workloads = {**deployments, **statefulsets}
    check(set(deployments) == {"strata-scheduler", "strata-compute"},
          f"{overlay}: deployments are {sorted(deployments)}")
    check(set(statefulsets) == {"strata-memory"}, f"{overlay}: statefulsets are {sorted(statefulsets)}")
    sched = deployments.get("strata-scheduler")
    if sched:
        check(sched["spec"].get("strategy", {}).get("type") == "Recreate",
              f"{overlay}: the scheduler must be replaced with strategy Recreate")
        check(sched["spec"].get("replicas") == 1, f"{overlay}: one scheduler")
        grace = pod_spec(sched).get("terminationGracePeriodSeconds", 30)
        check(grace >= 30, f"{overlay}: scheduler grace period {grace} s is too short to drain")
    memory = statefulsets.get("strata-memory")
    if memory:
        check(memory["spec"].get("serviceName") in by_kind(docs, "Service"),
              f"{overlay}: the memory StatefulSet's serviceName must be a Service")
        # Exclusive cores under the static CPU manager: Guaranteed QoS, whole cores.
        for c in pod_spec(memory)["containers"]:
            res = c.get("resources", {})
            check(res.get("requests") == res.get("limits"),
                  f"{overlay}/strata-memory/{c['name']}: requests differ from limits "
                  "(not Guaranteed, so no exclusive cores)")
            cpu = str(res.get("limits", {}).get("cpu", ""))
            check(cpu.isdigit() and int(cpu) >= 1,
                  f"{overlay}/strata-memory/{c['name']}: cpu {cpu!r} is not a whole number of cores")
    configmaps = by_kind(docs, "ConfigMap")
    topology = [c for n, c in configmaps.items() if n.startswith("strata-topology")]
    check(len(topology) == 1, f"{overlay}: one topology ConfigMap")
    topology_name = topology[0]["metadata"]["name"] if topology else None
    for name, w in workloads.items():
        spec = pod_spec(w)
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        check(annotations.get("prometheus.io/scrape") == "true", f"{overlay}/{name}: no scrape annotation")
        ports = {}
        for c in spec["containers"]:
            for p in c.get("ports", []):
                ports[p.get("name")] = p["containerPort"]
                ports[p["containerPort"]] = p["containerPort"]
            check(str(annotations.get("prometheus.io/port")) in {str(v) for v in ports.values()},
                  f"{overlay}/{name}: the scrape port is not a container port")
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    check(r in res.get(part, {}), f"{overlay}/{name}/{c['name']}: no {part}.{r}")
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not check(p is not None, f"{overlay}/{name}: no {probe}"):
                    continue
                if "httpGet" in p:
                    check(p["httpGet"]["path"] in ("/health", "/ready"),
                          f"{overlay}/{name}: {probe} on {p['httpGet']['path']}, not a health endpoint")
                    check(p["httpGet"]["port"] in ports, f"{overlay}/{name}: {probe} port is not exposed")
                elif "grpc" in p:
                    check(p["grpc"]["port"] in ports, f"{overlay}/{name}: {probe} port is not exposed")
                    if probe == "readinessProbe":
                        check(p["grpc"].get("service") == "strata.ready",
                              f"{overlay}/{name}: readiness must ask for strata.ready")
                else:
                    check(False, f"{overlay}/{name}: {probe} is neither HTTP nor gRPC")
            env_from = [e.get("configMapRef", {}).get("name") for e in c.get("envFrom", [])]
            check(topology_name in env_from, f"{overlay}/{name}: does not read the topology ConfigMap")
            # Every $(VAR) in args is defined.
            defined = set(topology[0]["data"]) if topology else set()
            defined |= {e["name"] for e in c.get("env", [])}
            for arg in c.get("args", []):
                for var in re.findall(r"\$\((\w+)\)", arg):
                    check(var in defined, f"{overlay}/{name}: $({var}) is not defined")
            # Every process reads the cluster secret from a Secret volume only its owner can read.
            secret_args = [a for a in c.get("args", []) if a.startswith("--cluster_secret_file=")]
            check(len(secret_args) == 1, f"{overlay}/{name}: no --cluster_secret_file")
            if secret_args:
                path = secret_args[0].split("=", 1)[1]
                mounts = [m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"] + "/")]
                check(len(mounts) == 1, f"{overlay}/{name}: the secret file is on no volume")
                for m in mounts:
                    vol = [v for v in spec.get("volumes", []) if v["name"] == m["name"]][0]
                    check(vol.get("secret", {}).get("secretName") == "strata-cluster-secret",
                          f"{overlay}/{name}: the cluster secret must come from the Secret strata-cluster-secret")
                    check(vol.get("secret", {}).get("defaultMode") == 0o400,
                          f"{overlay}/{name}: the cluster secret must be mounted with mode 0400")
            for m in c.get("volumeMounts", []):
                if m["name"] == "model":
                    vol = [v for v in spec.get("volumes", []) if v["name"] == "model"][0]
                    if "persistentVolumeClaim" in vol:
                        check(m.get("readOnly") is True, f"{overlay}/{name}: the model must be mounted read-only")
                        check(vol["persistentVolumeClaim"]["claimName"] in by_kind(docs, "PersistentVolumeClaim"),
                              f"{overlay}/{name}: the model PVC is missing")
    # PodDisruptionBudgets only where there is more than one replica.
    for name, pdb in by_kind(docs, "PodDisruptionBudget").items():
        selector = pdb["spec"]["selector"]["matchLabels"]
        targets = [w for w in workloads.values()
                   if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        check(len(targets) == 1, f"{overlay}: PDB {name} selects {len(targets)} workloads")
        for t in targets:
            check(t["spec"].get("replicas", 1) > 1,
                  f"{overlay}: PDB {name} on {t['metadata']['name']} with {t['spec'].get('replicas', 1)} replica")
    for name, w in workloads.items():
        if w["spec"].get("replicas", 1) > 1:
            labels = w["spec"]["template"]["metadata"]["labels"]
            check(any(all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())
                      for p in by_kind(docs, "PodDisruptionBudget").values()),
                  f"{overlay}: {name} has {w['spec']['replicas']} replicas and no PodDisruptionBudget")
    # The NetworkPolicy keeps control and data ports for strata's pods.
    policies = by_kind(docs, "NetworkPolicy")
    check(len(policies) == 1, f"{overlay}: one NetworkPolicy")
    for p in policies.values():
        internal = [r for r in p["spec"]["ingress"] if r.get("from")]
        internal_ports = {x["port"] for r in internal for x in r.get("ports", [])}
        open_ports = {x["port"] for r in p["spec"]["ingress"] if not r.get("from") for x in r.get("ports", [])}
        for port in (50050, 50060, 50070, 7000, 7001):
            check(port in internal_ports and port not in open_ports,
                  f"{overlay}: port {port} must be reachable only from strata's pods")
        for r in internal:
            for peer in r["from"]:
                check(peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/part-of") == "strata",
                      f"{overlay}: control/data ports open to something other than strata's pods")
    dashboards = [c for n, c in configmaps.items() if n == "strata-grafana-dashboards"]
    check(len(dashboards) == 1 and len(dashboards[0].get("data", {})) >= 2,
          f"{overlay}: the Grafana dashboards ConfigMap is missing")
    return workloads


def binary_flags(path):
    """The flags a binary accepts, from its --helpfull (Abseil flags)."""
    r = subprocess.run([path, "--helpfull"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"^\s+--([a-z0-9_]+) ", r.stdout + r.stderr, re.M))


def check_flags(overlay, docs, binaries):
    """Every container's command is a real binary and its --flags exist in it."""
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = pod_spec(d)
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            command = c.get("command", [])
            if not check(command, f"{overlay}/{d['metadata']['name']}/{c['name']}: no command"):
                continue
            name = os.path.basename(command[0])
            if not check(name in binaries, f"{overlay}/{c['name']}: {command[0]} is not a strata binary"):
                continue
            known = binaries[name]
            for arg in command[1:] + c.get("args", []):
                m = re.match(r"--([a-z0-9_]+)", arg)
                if m:
                    check(m.group(1) in known, f"{overlay}/{c['name']}: {name} has no flag --{m.group(1)}")


def check_schema(root, overlay, docs):
    """kubernetes-models' validators plus an unknown-field walk (tests/deploy/k8s_schema.mjs)."""
    cache = os.environ.get("STRATA_CACHE_DIR") or os.path.join(os.environ.get("HOME", "/root"), ".cache/strata")
    npm = os.path.join(cache, "npm")
    if not check(os.path.isdir(os.path.join(npm, "node_modules/kubernetes-models")),
                 f"kubernetes-models is not installed under {npm}: run deploy/setup.sh"):
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(docs, out)
    r = subprocess.run(["node", os.path.join(root, "tests/deploy/k8s_schema.mjs"), npm, out.name],
                       capture_output=True, text=True)
    print(f"{overlay}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]}")
    check(r.returncode == 0, f"{overlay}: schema validation failed:\n{r.stdout}{r.stderr[-2000:]}")


def check_kv_dtype_refusal(binary_paths):
    """The manifests set --kv_cache_dtype; the server refuses a type it does not know,
    before it starts anything, with an exit status of 2 and the names it does know."""
    for path in binary_paths:
        if os.path.basename(path) != "server":
            continue
        r = subprocess.run([path, "--kv_cache_dtype=f32"], capture_output=True, text=True,
                           timeout=60)
        check(r.returncode == 2 and '"f32" is not one of: bf16, f16' in r.stderr,
              f"server --kv_cache_dtype=f32: exit {r.returncode}, {r.stderr[-300:]!r}")


def check_k8s(root, binary_paths=()):
    binaries = {os.path.basename(b): binary_flags(b) for b in binary_paths}
    for name, flags in binaries.items():
        check(len(flags) > 5, f"{name}: could not read its flags")
    check_kv_dtype_refusal(binary_paths)
    cpu = render(root, "cpu-demo")
    check_schema(root, "cpu-demo", cpu)
    if binaries:
        check_flags("cpu-demo", cpu, binaries)
    w = check_workloads("cpu-demo", cpu)
    if w:
        for name in ("strata-scheduler", "strata-compute", "strata-memory"):
            for c in pod_spec(w[name])["containers"]:
                check(not any(k.startswith("nvidia.com/") or k.startswith("rdma/")
                              for k in c.get("resources", {}).get("limits", {})),
                      f"cpu-demo/{name}: asks for GPUs or RDMA devices")
        check(w["strata-compute"]["spec"]["replicas"] == 1, "cpu-demo: one compute node")
        check(not by_kind(cpu, "PersistentVolumeClaim"), "cpu-demo: needs no PVC")
        init = pod_spec(w["strata-compute"]).get("initContainers", [])
        check(any("make_model" in " ".join(i["command"]) for i in init), "cpu-demo: no demo model init")
    gpu = render(root, "gpu-rdma")
    check_schema(root, "gpu-rdma", gpu)
    if binaries:
        check_flags("gpu-rdma", gpu, binaries)
    w = check_workloads("gpu-rdma", gpu)
    if w:
        compute = pod_spec(w["strata-compute"])
        limits = compute["containers"][0]["resources"]["limits"]
        check("nvidia.com/gpu" in limits, "gpu-rdma: compute nodes get no GPU")
        check(any(k.startswith("rdma/") for k in limits), "gpu-rdma: compute nodes get no RDMA device")
        memory = pod_spec(w["strata-memory"])
        mlimits = memory["containers"][0]["resources"]["limits"]
        check(any(k.startswith("hugepages-") for k in mlimits), "gpu-rdma: memory nodes get no hugepages")
        check(any(k.startswith("rdma/") for k in mlimits), "gpu-rdma: memory nodes get no RDMA device")
        for name, spec in (("compute", compute), ("memory", memory)):
            env = {e["name"] for e in spec["containers"][0].get("env", [])}
            check("UCX_TLS" in env, f"gpu-rdma/{name}: UCX_TLS is not set")
            check(spec.get("hostNetwork") is True, f"gpu-rdma/{name}: no host networking for RDMA")


def check_grafana(root):
    files = sorted(glob.glob(os.path.join(root, "deploy/grafana/*.json")))
    check(len(files) >= 2, "fewer than two dashboards")
    rules, names = [], set()
    for f in files:
        d = json.load(open(f))
        check(d.get("uid") and d.get("title"), f"{f}: no uid or title")
        for p in d["panels"]:
            check(p.get("targets"), f"{f}: panel {p.get('title')} has no query")
            for t in p.get("targets", []):
                # Grafana's template variables are valid PromQL inside label matchers.
                expr = t["expr"]
                rules.append({"record": f"strata_dashboard:{os.path.basename(f)[:-5].replace('-', '_')}:{p['id']}{t['refId']}",
                              "expr": expr})
                names |= set(re.findall(r"\bstrata_[a-z0-9_]+", expr))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as out:
        yaml.safe_dump({"groups": [{"name": "strata-dashboards", "rules": rules}]}, out)
    r = subprocess.run(["promtool", "check", "rules", out.name], capture_output=True, text=True)
    check(r.returncode == 0, f"promtool check rules: {r.stdout}{r.stderr}")
    print(f"{len(rules)} panel queries checked; metrics used: {len(names)}")
    # The metrics the dashboards use, for //tests/e2e:metrics_test to find in real scrapes.
    out_dir = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if out_dir:
        open(os.path.join(out_dir, "dashboard_metrics.txt"), "w").write("\n".join(sorted(names)) + "\n")


def packages_of(paths):
    """Debian package of each path (None if none), with one dpkg call (dpkg -S is slow)."""
    def variants(path):
        if path.startswith("/usr/lib/"):
            return [path, path[len("/usr"):]]
        if path.startswith("/lib/"):
            return [path, "/usr" + path]
        return [path]
    queries = sorted({v for p in paths for v in variants(p)})
    r = subprocess.run(["dpkg", "-S"] + queries, capture_output=True, text=True)
    owner = {}
    for line in r.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        owner[path.strip()] = pkg.split(":")[0].strip()
    return {p: next((owner[v] for v in variants(p) if v in owner), None) for p in paths}


# Packages every debian:12-slim image already has (Priority: required).
BASE_IMAGE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def check_image(root, binaries):
    text = open(os.path.join(root, "deploy/Dockerfile")).read()
    m = re.search(r"# runtime-packages-begin(.*?)# runtime-packages-end", text, re.S)
    if not check(m, "Dockerfile: no runtime-packages block"):
        return
    listed = set(re.findall(r"^\s+([a-z0-9][a-z0-9.+-]+) \\$", m.group(1), re.M))
    check("deploy/setup.sh" in text and re.search(r"RUN /src/deploy/setup.sh", text),
          "Dockerfile: the build stage must run deploy/setup.sh")
    linked = {}  # resolved library -> binaries
    for b in binaries:
        r = subprocess.run(["ldd", b], capture_output=True, text=True)
        check(r.returncode == 0, f"ldd {b} failed")
        for line in r.stdout.splitlines():
            mm = re.search(r"=> (/\S+)", line)
            if mm:
                linked.setdefault(os.path.realpath(mm.group(1)), set()).add(os.path.basename(b))
    owners = packages_of(list(linked))
    needed = {}
    for lib, users in sorted(linked.items()):
        pkg = owners[lib]
        check(pkg is not None, f"{lib} (linked by {', '.join(sorted(users))}) belongs to no Debian package")
        if pkg:
            needed.setdefault(pkg, set()).update(users)
    for pkg, users in sorted(needed.items()):
        check(pkg in listed or pkg in BASE_IMAGE,
              f"Dockerfile: runtime package {pkg} is missing (needed by {', '.join(sorted(users))})")
    unused = listed - set(needed)
    print(f"{len(needed)} packages needed; listed but not linked (dlopen'ed or indirect): {sorted(unused)}")


def main():
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "k8s":
        check_k8s(root, sys.argv[3:])
    elif mode == "grafana":
        check_grafana(root)
    elif mode == "image":
        check_image(root, sys.argv[3:])
    else:
        sys.exit(f"unknown mode {mode}")
    print(f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
