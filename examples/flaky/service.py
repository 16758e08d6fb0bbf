#!/usr/bin/env python3
"""A small service with a seeded startup delay: it sleeps (SEED % 5) * 0.25 s,
then listens on 127.0.0.1:8765 and answers GET / with its token and a request
counter kept in memory."""
import http.server
import os
import secrets
import time

seed = int(os.environ.get("SEED", "0"))
time.sleep((seed % 5) * 0.25)

token = secrets.token_hex(8)
count = 0


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"token={token} count={count} pid={os.getpid()}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


http.server.HTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
