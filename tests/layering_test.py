#!/usr/bin/python3
"""The layering the build keeps (docs/architecture.md, "Build and deployment"):

- common/ is a leaf: its BUILD files depend on nothing in the project outside common/,
  proto/ and third_party/, and its sources include no header from elsewhere in it;
- kernels/ knows nothing of the server: it depends only on common/ and third_party/,
  and includes nothing from server/, compute_node/, memory_node/, deploy/ or tests/;
- production code includes no test code: no file outside tests/ (and no *_test.cc or
  bench/ file) includes a header from tests/;
- README.md's map of the code matches the directories: every directory of the project
  (down to the second level, third_party/ as one) is in its table, and every directory
  the table names exists.

Like format_test, it runs outside the sandbox and reads the files git tracks.
"""
import os
import re
import subprocess
import sys

config = os.path.realpath(os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"],
                                       ".clang-format"))
root = os.path.dirname(config)
files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                       check=True).stdout.split()
if not files:
    sys.exit(f"no files found under {root}")

LABEL = re.compile(r'"(//[A-Za-z0-9_/.-]*)(?::[^"]*)?"')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
problems = []


def package_of(label):
    return label[2:].split(":")[0]


def check_build(path, allowed):
    text = open(os.path.join(root, path)).read()
    # A visibility list names who may use a target, not a dependency.
    text = re.sub(r"visibility\s*=\s*\[[^\]]*\]", "", text)
    for m in LABEL.finditer(text):
        package = package_of(m.group(1))
        if not any(package == a or package.startswith(a + "/") for a in allowed):
            problems.append(f"{path}: depends on //{package}")


def check_includes(path, forbidden):
    text = open(os.path.join(root, path), errors="replace").read()
    for m in INCLUDE.finditer(text):
        header = m.group(1)
        if any(header.startswith(f + "/") for f in forbidden):
            problems.append(f"{path}: includes {header}")


PROJECT = ["common", "compute_node", "memory_node", "server", "kernels", "deploy", "tests", "proto"]
checked = 0
for path in files:
    top = path.split("/")[0]
    is_build = os.path.basename(path) == "BUILD"
    is_source = path.endswith((".cc", ".h", ".cu", ".cuh"))
    if top == "common":
        if is_build:
            check_build(path, ["common", "proto", "third_party"])
            checked += 1
        elif is_source:
            check_includes(path, [p for p in PROJECT if p not in ("common", "proto")])
            checked += 1
    elif top == "kernels":
        if is_build:
            check_build(path, ["kernels", "common", "third_party"])
            checked += 1
        elif is_source:
            check_includes(path, ["server", "compute_node", "memory_node", "deploy", "tests"])
            checked += 1
    if is_source and top != "tests" and not path.endswith("_test.cc") and "/bench/" not in path:
        check_includes(path, ["tests"])

# README.md's map of the code.
readme = open(os.path.join(root, "README.md")).read()
start = readme.find("| Directory | What it holds |")
if start < 0:
    problems.append("README.md: no table of directories")
else:
    table = readme[start:readme.find("\n\n", start)]
    named = set(re.findall(r"`([a-z0-9_]+(?:/[a-z0-9_]+)?)/`", table))
    dirs = set()
    for path in files:
        parts = path.split("/")[:-1]
        if not parts or parts[0].startswith("."):
            continue
        if parts[0] in ("third_party", "docs", "proto", "memory_node"):
            dirs.add(parts[0])
        else:
            dirs.add("/".join(parts[:2]))
    for d in sorted(dirs - named):
        problems.append(f"README.md: the map of the code does not name {d}/")
    for d in sorted(named - dirs):
        problems.append(f"README.md: the map of the code names {d}/, which does not exist")
    checked += 1

for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print(f"{checked} files of common/ and kernels/ keep their layers")
