"""A real nginx on loopback serving a folder laid out as the Hugging Face hub
(`/{repo}/resolve/{revision}/{path}`, `/api/models/...`), for the Python suites (tests/api,
tests/gguf): every response carries `X-Repo-Commit`, the access log (when asked for) records
each request's status, URI and Range."""

import os
import socket
import subprocess
import time
import urllib.request

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def nginx_bin():
    for p in ("/usr/sbin/nginx", "/usr/bin/nginx"):
        if os.path.exists(p):
            return p
    pytest.fail("nginx is not installed (.ci/run installs it)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx serving `root/www`, its files (config, logs, temp) in `root`; started, it is up
    once `probe` (a path on it) answers."""

    def __init__(self, root, probe, log=False):
        self.root = root
        self.probe = probe
        self.log = log
        self.port = free_port()
        self.proc = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        r = self.root
        user = "user root;\n" if os.geteuid() == 0 else ""
        log = f"log_format ranged '$status $request_uri range=$http_range';\n access_log {r}/access.log ranged"
        (r / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {r}/nginx.pid;\n"
            f"error_log {r}/error.log;\n{user}events {{ worker_connections 64; }}\n"
            f"http {{\n {log if self.log else 'access_log off'};\n client_body_temp_path {r}/tmp;\n"
            f" proxy_temp_path {r}/tmp;\n fastcgi_temp_path {r}/tmp;\n uwsgi_temp_path {r}/tmp;\n"
            f" scgi_temp_path {r}/tmp;\n default_type application/octet-stream;\n"
            f" server {{ listen 127.0.0.1:{self.port}; root {r}/www;\n"
            f"  location / {{ add_header X-Repo-Commit {COMMIT} always; }} }}\n}}\n"
        )
        (r / "tmp").mkdir(exist_ok=True)
        self.proc = subprocess.Popen([nginx_bin(), "-c", str(r / "nginx.conf")], stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}{self.probe}", timeout=1)
                return self
            except OSError:
                if time.time() > deadline:
                    self.stop()
                    pytest.fail("nginx did not start")
                time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def requests(self, needle):
        """The access log's lines that contain `needle`."""
        log = (self.root / "access.log").read_text()
        return [line for line in log.splitlines() if needle in line]
