"""A `python -m impnb serve` subprocess on a free port for the HTTP tests, small readers of its
/metrics, and raw HTTP through the standard library (http.client), whatever the openai client
uses underneath."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

API_KEY = "impnb-test-key"


@dataclass
class Reply:
    status_code: int
    text: str

    def json(self):
        return json.loads(self.text)


def request(url: str, method: str, path: str, body=None, headers=None, timeout: float = 120) -> Reply:
    """One HTTP exchange; body: bytes, str, or an object sent as JSON."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, r.read().decode("utf-8", errors="replace"))
    finally:
        conn.close()


def post_unread(url: str, path: str, body: dict, headers: dict, timeout: float = 60):
    """A POST whose answer is not read: the connection, to close as a client that leaves."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers})
    return conn


def open_stream(url: str, path: str, body: dict, headers: dict, timeout: float = 60):
    """A streaming POST: (connection, response) to read lines from; close the connection to leave."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers})
    return conn, conn.getresponse()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """The server on 127.0.0.1:port; `health` holds the /health statuses seen while it loaded."""

    def __init__(self, model, *args, timeout: float = 600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "impnb", "serve", "-m", str(model), "--port", str(self.port),
               "--served-model-name", "test-model", "--api-key", API_KEY, "--log-level", "warning", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.health: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                code = request(self.url, "GET", "/health", timeout=5).status_code
            except OSError:
                time.sleep(0.05)
                continue
            self.health.append(code)
            if code == 200:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the server did not become healthy in time")

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of /metrics by name."""
        text = request(self.url, "GET", "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()
                out[name] = float(value)
        return out

    def wait_idle(self, timeout: float = 60) -> dict[str, float]:
        """/metrics once no request runs or waits (or the last reading at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = m["impnb_num_requests_running"] + m["impnb_num_requests_waiting"] + m["impnb_kv_blocks_used"]
            if not busy or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
