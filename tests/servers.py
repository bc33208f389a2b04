"""``serve.py`` as a client meets it, for the serving tests: the real server in a child process on a free
port of 127.0.0.1, requests to it, and translate.py's lines to compare its answers with."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers import ROOT, run_command

from transformer.commands import translate

LINES = [
    "Ein Hund läuft über die Wiese.",
    "",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau liest ein Buch.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python serve.py`` in a child process, on 127.0.0.1."""

    def __init__(self, checkpoint: Path, *flags: str, env: dict | None = None):
        self.port = free_port()
        command = [
            sys.executable,
            "serve.py",
            "--checkpoint",
            str(checkpoint),
            "--port",
            str(self.port),
            *flags,
        ]
        self.log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a long log would fill it and block
        environment = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve.py exited: {self.output()[-3000:]}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("serve.py did not answer /health within 120 s")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def request(
        self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None
    ):
        """(status, the answer's JSON or text); ``raw``: the body's bytes as they are."""
        status, payload, _ = self.exchange(method, path, body, headers, raw)
        return status, payload

    def exchange(self, method, path, body=None, headers=None, raw=None, timeout: float = 60):
        """(status, payload, response headers)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        connection.request(
            method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        try:
            return response.status, json.loads(payload), response
        except ValueError:
            return response.status, payload.decode("utf-8", "replace"), response

    def translate(self, **body):
        return self.request("POST", "/translate", body)

    def abandon(self, body: dict) -> None:
        """Send a translation request and hang up at once, without reading the answer."""
        gone = socket.create_connection(("127.0.0.1", self.port))
        data = json.dumps(body).encode()
        gone.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)  # fmt: skip
        gone.close()

    def stop(self) -> int:
        """SIGTERM, and the exit status: 0, or uvicorn's own SIGTERM raised again once it has shut down."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=60)
        return 0 if status == -signal.SIGTERM else status


def translate_py(checkpoint: Path, lines: list[str], tmp_path: Path, *flags: str) -> list[str]:
    """translate.py's output lines for ``lines`` (its default options, then ``flags``)."""
    source = tmp_path / "input.de"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    done = run_command(translate.main, ["--checkpoint", str(checkpoint), "--input", str(source), *flags])
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]
