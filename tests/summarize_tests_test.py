#!/usr/bin/env python3
"""summarize_tests.py on build-event files as Bazel 4.2.3 writes them: test cases are counted
from each target's XML, and a target that failed to build counts as a failed case (which
once came out as "0 failed": Bazel leaves "success" out of a failed target's event)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "summarize_tests.py")

XML_THREE_CASES = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="S" tests="3">
<testcase name="a" status="run" result="completed"/>
<testcase name="b" status="run" result="completed"/>
<testcase name="c" status="run" result="skipped"><skipped/></testcase>
</testsuite></testsuites>
"""
XML_ONE_FAILURE = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="S" tests="2">
<testcase name="a" status="run" result="completed"/>
<testcase name="b" status="run" result="completed"><failure message="x"/></testcase>
</testsuite></testsuites>
"""


def summary(label, status):
    return {"id": {"testSummary": {"label": label}}, "testSummary": {"overallStatus": status}}


def completed(label, event):
    return dict({"id": {"targetCompleted": {"label": label}}}, **event)


class SummarizeTests(unittest.TestCase):

    def run_on(self, events, xml_by_target):
        with tempfile.TemporaryDirectory() as root:
            for target, text in xml_by_target.items():
                package, name = target.split(":")
                directory = os.path.join(root, "bazel-testlogs", package, name)
                os.makedirs(directory)
                with open(os.path.join(directory, "test.xml"), "w") as f:
                    f.write(text)
            bep = os.path.join(root, "bep.json")
            with open(bep, "w") as f:
                for event in events:
                    f.write(json.dumps(event) + "\n")
            out = subprocess.run([sys.executable, SCRIPT, bep, root], capture_output=True,
                                 text=True)
            return out.stdout.splitlines(), out.returncode

    def test_cases_are_counted_from_each_targets_xml(self):
        lines, rc = self.run_on(
            [completed("//a:t", {"completed": {"success": True}}), summary("//a:t", "PASSED"),
             completed("//b:u", {"completed": {"success": True}}), summary("//b:u", "FAILED")],
            {"a:t": XML_THREE_CASES, "b:u": XML_ONE_FAILURE})
        self.assertEqual(lines[-1], "3 passed, 1 failed")
        self.assertIn("(1 test cases skipped themselves; see their logs)", lines)
        self.assertEqual(rc, 1)

    def test_a_target_that_did_not_build_is_a_failure(self):
        # Bazel 4.2.3's event for a test that failed to compile: no "success", a failureDetail.
        failed_build = {"completed": {"failureDetail": {"message": "process-wrapper failed"}}}
        lines, rc = self.run_on(
            [completed("//a:t", {"completed": {"success": True}}), summary("//a:t", "PASSED"),
             completed("//c:broken", failed_build),
             completed("//d:skipped", {"aborted": {"reason": "SKIPPED"}})],
            {"a:t": XML_THREE_CASES})
        self.assertEqual(lines[-1], "2 passed, 2 failed")
        self.assertIn("  not passed: //c:broken: FAILED_TO_BUILD", lines)
        self.assertIn("  not passed: //d:skipped: FAILED_TO_BUILD", lines)
        self.assertEqual(rc, 1)

    def test_all_passing_exits_zero(self):
        lines, rc = self.run_on(
            [completed("//a:t", {"completed": {"success": True}}), summary("//a:t", "PASSED")],
            {"a:t": XML_THREE_CASES})
        self.assertEqual(lines[-1], "2 passed, 0 failed")
        self.assertEqual(rc, 0)


if __name__ == "__main__":
    unittest.main()
