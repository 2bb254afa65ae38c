#!/usr/bin/env python3
"""A relay between Compactor and llama-server that records what Compactor forwards.

The Anthropic scenarios check the bodies Compactor sends upstream (tool pairs kept, the current
turn byte for byte, at most 4 cache breakpoints), which no client can see. Compactor's
`anthropic_upstream` points here; every request is passed on to the target unchanged and the
answer streamed back as it arrives. POST bodies are appended to the log, one JSON line each:
`{"path", "status", "body"}` (the body as JSON when it parses, else as text).

    recording_relay.py PORT TARGET_URL LOGFILE
"""

import http.client
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
lock = threading.Lock()


class Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.relay(b"")

    def do_POST(self):
        self.relay(self.rfile.read(int(self.headers.get("content-length", 0))))

    def relay(self, body):
        target = self.server.target
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=900)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn.request(self.command, target.path.rstrip("/") + self.path, body=body, headers=headers)
        upstream = conn.getresponse()
        if self.command == "POST":
            try:
                recorded = json.loads(body)
            except ValueError:
                recorded = body.decode("utf-8", "replace")
            with lock, open(self.server.log_path, "a") as log:
                log.write(json.dumps({"path": self.path, "status": upstream.status, "body": recorded}) + "\n")
        self.send_response(upstream.status)
        for k, v in upstream.getheaders():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        while True:
            chunk = upstream.read1(65536)
            if not chunk:
                break
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        conn.close()


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Relay)
    server.target = urllib.parse.urlparse(sys.argv[2])
    server.log_path = sys.argv[3]
    server.serve_forever()
