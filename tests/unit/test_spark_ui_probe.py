"""A Spark driver service is found on the Spark UI REST API, also past a port that answers no HTTP.

Spark takes one of the next ports when its UI port is taken, so the readiness probe walks them.
One of them may belong to anything, e.g. another JVM's Py4J gateway, which answers an HTTP GET
with a Py4J error line: CI's run of 2026-11-25 failed the analytics test on exactly that
(``http.client.BadStatusLine``). Such a port is skipped, not fatal.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from infra.settings import get_settings
from infra.stack import Analytics


def _not_http(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        with conn:
            conn.recv(1024)
            conn.sendall(b"!zspy4j.Py4JException: Unknown command received: GET /api/v1/applications\n")


def test_the_probe_skips_a_port_that_answers_no_http_and_finds_the_ui_after_it(tmp_path):
    service = Analytics(get_settings(var_dir=tmp_path, analytics=1))
    service.settings.run_dir.mkdir(parents=True, exist_ok=True)

    # two ports side by side: the recorded UI port, taken by something that answers no HTTP, and
    # the next one, where the Spark UI went
    for _ in range(50):
        garbage = socket.socket()
        garbage.bind(("127.0.0.1", 0))
        port = garbage.getsockname()[1]
        try:
            ui = ThreadingHTTPServer(("127.0.0.1", port + 1), _SparkUi)
            break
        except OSError:
            garbage.close()
    else:
        raise AssertionError("no two free ports side by side")
    garbage.listen()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_not_http, args=(garbage, stop), daemon=True),
        threading.Thread(target=ui.serve_forever, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        service.ui_port_file.write_text(f"{port}\n")
        assert service.application() == "analytics-live"
    finally:
        stop.set()
        ui.shutdown()
        ui.server_close()
        garbage.close()


class _SparkUi(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server API
        body = json.dumps([{"id": "app-1", "name": "analytics-live"}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass
