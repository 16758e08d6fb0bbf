# The pytest acceptance test of hunt --freeze: a server fixture, a random
# token in a local variable, and a seeded race that fails the test now and
# then. Its teardown writes /tmp/pytest-teardown-SEED.
import http.server
import os
import random
import secrets
import threading
import time
import urllib.request

import pytest

PORT = 8765


@pytest.fixture
def server():
    state = {"token": ""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ("token=%s\n" % state["token"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            state["token"] = self.rfile.read(n).decode()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()
    with open("/tmp/pytest-teardown-" + os.environ.get("SEED", "none"), "w") as f:
        f.write("yes\n")


def test_race(server):
    rng = random.Random(int(os.environ.get("SEED", "0")))
    worker, wait = rng.random() * 0.02, rng.random() * 0.02
    token = secrets.token_hex(8)
    req = urllib.request.Request("http://127.0.0.1:%d/" % PORT, data=token.encode(), method="POST")
    urllib.request.urlopen(req, timeout=5).read()
    ready = threading.Event()
    threading.Timer(worker, ready.set).start()
    time.sleep(wait)
    assert ready.is_set(), "the worker was not ready"  # FAIL_LINE
