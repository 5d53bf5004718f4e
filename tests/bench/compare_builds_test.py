"""The benchmarks' streamed-completion clients (compare_builds.stream_event_times, and
streams_event_times for several streams at once) and the token count over them
(token_event_times), against a local HTTP server that streams
server-sent events the way each engine ends a stream: strata with the finish reason on the
last token's event, llama-server with one more event after the tokens. The server writes
in pieces of 7 bytes, so that event markers are split across the client's reads."""
import http.server
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402


def events(tokens, closing_event):
    out = []
    for i in range(tokens):
        last = i == tokens - 1 and not closing_event
        out.append({"choices": [{"text": f"t{i}", "finish_reason": "length" if last else None}]})
    if closing_event:
        out.append({"choices": [{"text": "", "finish_reason": "length"}]})
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("fail"):
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n"
                          for e in events(body["tokens"], body["closing_event"]))
        stream += b"data: [DONE]\n\n"
        for i in range(0, len(stream), 7):
            self.wfile.write(stream[i:i + 7])
            self.wfile.flush()
            time.sleep(0.0005)
        self.close_connection = True

    def log_message(self, *args):
        pass


class StreamedTokensTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        cls.port = cls.server.server_address[1]
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def times(self, tokens, closing_event):
        return compare_builds.stream_event_times(
            self.port, {"tokens": tokens, "closing_event": closing_event})

    def test_every_event_is_seen_once_across_split_reads(self):
        self.assertEqual(len(self.times(12, False)), 12)
        self.assertEqual(len(self.times(12, True)), 13)

    def test_the_tokens_are_the_first_max_tokens_events(self):
        for closing_event in (False, True):
            times = self.times(12, closing_event)
            tokens = compare_builds.token_event_times(times, 12)
            self.assertEqual(tokens, times[:12])
            self.assertEqual(len(tokens), 12)
            self.assertTrue(all(a <= b for a, b in zip(tokens, tokens[1:])))

    def test_a_stream_short_of_its_tokens_or_with_extra_events_is_refused(self):
        with self.assertRaises(RuntimeError):
            compare_builds.token_event_times(self.times(11, False), 12)
        with self.assertRaises(RuntimeError):
            compare_builds.token_event_times(self.times(12, True) + [time.monotonic()], 12)

    def test_a_refused_request_raises(self):
        with self.assertRaises(RuntimeError):
            compare_builds.stream_event_times(self.port, {"fail": True})

    def test_streams_read_together_keep_each_its_own_events(self):
        bodies = [{"tokens": n, "closing_event": n % 2 == 0} for n in (3, 12, 7, 20, 1)]
        streams = compare_builds.streams_event_times(self.port, bodies)
        self.assertEqual([len(t) for t in streams], [3, 13, 7, 21, 1])
        for times in streams:
            self.assertTrue(all(a <= b for a, b in zip(times, times[1:])))

    def test_streams_read_together_raise_for_a_refused_one(self):
        with self.assertRaises(RuntimeError):
            compare_builds.streams_event_times(
                self.port, [{"tokens": 5, "closing_event": False}, {"fail": True}])


if __name__ == "__main__":
    unittest.main()
