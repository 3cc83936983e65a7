"""Starts `strata serve` on fixture models for the OpenAI-client tests.

The binary is $STRATA_BIN, else target/release/strata or target/debug/strata (whichever is
newer); fixtures are $STRATA_FIXTURES, else ../shared/fixtures beside the repository.
$STRATA_SERVE_PREFIX (words) runs the server under a wrapper, e.g. a memory cap:
`STRATA_SERVE_PREFIX="../shared/tools/capmem.sh 1200M"`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
# tests/nginx_hub.py, shared with the GGUF suite.
sys.path.insert(0, str(REPO / "tests"))
from nginx_hub import free_port  # noqa: E402  (after the path above)


def strata_bin() -> str:
    if os.environ.get("STRATA_BIN"):
        return os.environ["STRATA_BIN"]
    found = [p for p in (REPO / "target/release/strata", REPO / "target/debug/strata") if p.exists()]
    if not found:
        pytest.exit("no strata binary: run `cargo build` first or set STRATA_BIN", returncode=2)
    return str(max(found, key=lambda p: p.stat().st_mtime))


def fixtures() -> Path:
    d = Path(os.environ.get("STRATA_FIXTURES", REPO.parent / "shared" / "fixtures"))
    if not d.is_dir():
        pytest.exit(f"fixtures not found at {d}", returncode=2)
    return d


class Server:
    def __init__(self, model: Path, *extra: str, env=None):
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="strata-serve-", suffix=".log", delete=False)
        prefix = os.environ.get("STRATA_SERVE_PREFIX", "").split()
        self.proc = subprocess.Popen(
            [*prefix, strata_bin(), "serve", "--model", str(model), "--port", str(self.port), *extra],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata serve exited: {Path(self.log.name).read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("strata serve did not become healthy")

    def pid(self) -> int:
        """The strata process itself (below any $STRATA_SERVE_PREFIX wrapper)."""
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "strata":
                    return pid
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except OSError:
                pass
        return self.proc.pid

    def client(self, strict: bool = True, **kw) -> openai.OpenAI:
        kw.setdefault("api_key", "unused")
        return openai.OpenAI(base_url=self.url + "/v1", _strict_response_validation=strict, max_retries=0, **kw)

    def metrics(self) -> dict:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        inner = self.pid()
        if inner != self.proc.pid:
            try:
                os.kill(inner, 15)
            except OSError:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return fixtures()


@pytest.fixture(scope="session")
def server(fixtures_dir):
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--max-concurrent", "16", "--max-queued", "64")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def model_name(server) -> str:
    return server.model.name


@pytest.fixture(scope="session")
def tools_model(fixtures_dir, tmp_path_factory) -> Path:
    """qwen3-moe-tiny with the real Qwen3 chat template (it renders tools and tool results)."""
    d = tmp_path_factory.mktemp("qwen3-tools")
    src = fixtures_dir / "qwen3-moe-tiny"
    for f in src.iterdir():
        if not f.name.startswith("golden"):
            shutil.copy(f, d / f.name)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    real = json.loads((fixtures_dir / "tokenizers" / "qwen3" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = real["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def run_cli(*args: str) -> dict:
    out = subprocess.run([strata_bin(), *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
