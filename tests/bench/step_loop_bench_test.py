"""step_loop_bench's steady-minute ratios (steady_ratios): each served stream against the
in-process measurements nearest before and after it, kept only where those two agree, on
sequences laid out as the benchmark takes them (pairs alternating which goes first)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_loop_bench  # noqa: E402


class SteadyRatiosTest(unittest.TestCase):
    def test_streams_between_agreeing_measurements_count_against_their_mean(self):
        # pairs (in, served), (served, in), (in, served), (served, in)
        sequence = [("in", 100.0), ("served", 95.0), ("served", 90.0), ("in", 104.0),
                    ("in", 102.0), ("served", 99.0), ("served", 97.0), ("in", 98.0)]
        ratios, bracketed = step_loop_bench.steady_ratios(sequence)
        self.assertEqual(bracketed, 4)
        want = [95.0 / 102.0, 90.0 / 102.0, 99.0 / 100.0, 97.0 / 100.0]
        self.assertEqual(len(ratios), len(want))
        for got, w in zip(ratios, want):
            self.assertAlmostEqual(got, w)

    def test_a_stream_across_a_change_of_speed_is_left_out(self):
        # The machine speeds up by half between the second and third measurement.
        sequence = [("in", 200.0), ("served", 190.0), ("served", 280.0), ("in", 300.0),
                    ("in", 298.0), ("served", 290.0)]
        ratios, bracketed = step_loop_bench.steady_ratios(sequence)
        self.assertEqual(bracketed, 2)  # the last stream has nothing after it
        self.assertEqual(len(ratios), 0)

    def test_the_bound_is_a_twentieth_of_the_mean(self):
        inside = [("in", 100.0), ("served", 95.0), ("in", 104.9)]
        outside = [("in", 100.0), ("served", 95.0), ("in", 105.2)]
        self.assertEqual(len(step_loop_bench.steady_ratios(inside)[0]), 1)
        self.assertEqual(len(step_loop_bench.steady_ratios(outside)[0]), 0)


if __name__ == "__main__":
    unittest.main()
