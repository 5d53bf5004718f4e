#!/usr/bin/env python3
"""Adds up test results of one `bazel test` run and prints "N passed, N failed".

Reads the run's build-event JSON to learn which test targets ran and how each ended. A
target that wrote JUnit XML (GoogleTest, or Bazel's own XML for script tests) counts its
test cases; a target that failed without XML (a build failure, a crash before XML, a
timeout) counts as one failed case. Skipped cases are reported apart.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


def cases_from_xml(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("status") == "notrun" or case.find("skipped") is not None \
                or case.get("result") == "skipped":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    bep_path, root = sys.argv[1], sys.argv[2]
    summaries = {}
    try:
        with open(bep_path) as f:
            for line in f:
                event = json.loads(line)
                ident = event.get("id", {})
                if "testSummary" in ident:
                    label = ident["testSummary"]["label"]
                    summaries[label] = event.get("testSummary", {}).get("overallStatus", "NO_STATUS")
                elif "targetCompleted" in ident:
                    # A target that did not build: "completed" without "success" (the JSON
                    # leaves out a false field; Bazel 4 gives a failureDetail instead), or
                    # "aborted" in place of "completed" (a dependency failed).
                    completed = event.get("completed")
                    if completed is None or not completed.get("success", False):
                        label = ident["targetCompleted"]["label"]
                        summaries.setdefault(label, "FAILED_TO_BUILD")
    except OSError:
        pass

    passed = failed = skipped = 0
    broken = []
    for label, status in sorted(summaries.items()):
        package, _, name = label.lstrip("/").partition(":")
        xml_path = os.path.join(root, "bazel-testlogs", package, name, "test.xml")
        counted = False
        if status in ("PASSED", "FLAKY", "FAILED") and os.path.exists(xml_path):
            try:
                p, f, s = cases_from_xml(xml_path)
                if p + f + s > 0:
                    if status == "FAILED" and f == 0:
                        f = 1  # the binary failed after its cases passed (a crash at exit)
                    passed, failed, skipped = passed + p, failed + f, skipped + s
                    counted = True
            except ET.ParseError:
                pass
        if not counted:
            if status in ("PASSED", "FLAKY"):
                passed += 1
            else:
                failed += 1
        if status not in ("PASSED", "FLAKY"):
            broken.append(f"{label}: {status}")

    for line in broken:
        print("  not passed:", line)
    if skipped:
        print(f"({skipped} test cases skipped themselves; see their logs)")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and summaries else 1


if __name__ == "__main__":
    sys.exit(main())
