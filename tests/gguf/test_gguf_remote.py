"""GGUF models straight from a Hugging Face-style repository, served by a real nginx on loopback
(`/{repo}/resolve/{revision}/{path}`, and the hub's `/api/models/{repo}/revision/{revision}` file
list): `hf://ORG/NAME:TAG` picks a file by its quantization tag (a split model in a folder
included), `hf://ORG/NAME/PATH` by its path, a `.gguf` URL is that file. Each gives the logits
and text of the same file run locally; the header arrives in steps when the first request is
short; a cached model runs offline with the server stopped; a tag the repository lacks is an
error that lists the tags it has."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import CONVERTER, csv, fixtures_dir, strata, strata_bin
from nginx_hub import COMMIT, Nginx

MODEL = "qwen3-moe-tiny"


def convert(out, *extra):
    folder = fixtures_dir() / MODEL
    cmd = [sys.executable, str(CONVERTER), str(folder), str(out), *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """nginx serving hf://test/g: M-Q8_0.gguf, a BF16 model split in three in BF16/, a projector
    and a README; yields (hub, the repository's folder)."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / "repo"
    (repo / "BF16").mkdir(parents=True)
    convert(repo / "M-Q8_0.gguf", "--outtype", "q8_0")
    convert(repo / "BF16" / "M-BF16.gguf", "--outtype", "bf16", "--split-max-tensors", "16")
    shutil.copy(repo / "M-Q8_0.gguf", repo / "mmproj-M-F16.gguf")
    (repo / "README.md").write_text("test\n")
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    assert "BF16/M-BF16-00003-of-00003.gguf" in files, files
    listing = json.dumps({"id": "test/g", "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]})
    api = root / "www" / "api" / "models" / "test" / "g" / "revision"
    api.mkdir(parents=True)
    resolve = root / "www" / "test" / "g" / "resolve"
    resolve.mkdir(parents=True)
    for rev in ("main", COMMIT):
        (api / rev).write_text(listing)
        (resolve / rev).symlink_to(repo)
    h = Nginx(root, "/api/models/test/g/revision/main", log=True).start()
    yield h, repo
    h.stop()


def run(*args, env=None, ok=True):
    full = {**os.environ, "HF_HUB_OFFLINE": "0", **(env or {})}
    full.pop("HF_TOKEN", None)
    p = subprocess.run([strata_bin(), *map(str, args)], capture_output=True, text=True, env=full)
    if ok:
        assert p.returncode == 0, f"strata {' '.join(map(str, args))} failed:\n{p.stderr}"
    return p


def ids():
    g = json.loads((fixtures_dir() / MODEL / "golden.json").read_text())
    return csv(g["prompts"][-1]["ids"])


def remote_env(hub_, tmp_path):
    return {"HF_ENDPOINT": hub_.endpoint, "HF_HOME": str(tmp_path / "hf"), "STRATA_HTTP_BACKOFF_MS": "20"}


def logits(model, env, cache, *extra):
    p = run("logits", "--model", model, "--ids", ids(), "--cache-dir", cache, *extra, env=env)
    return json.loads(p.stdout)["last_logits"]


@pytest.mark.parametrize(
    "spec,local",
    [
        ("hf://test/g:Q8_0", "M-Q8_0.gguf"),
        ("test/g:q8_0", "M-Q8_0.gguf"),
        ("hf://test/g:BF16", "BF16/M-BF16-00001-of-00003.gguf"),
        ("hf://test/g/BF16/M-BF16-00001-of-00003.gguf", "BF16/M-BF16-00001-of-00003.gguf"),
        ("URL/test/g/resolve/main/M-Q8_0.gguf", "M-Q8_0.gguf"),
    ],
)
def test_a_picked_gguf_gives_the_local_files_logits(hub, tmp_path, spec, local):
    h, repo = hub
    env = remote_env(h, tmp_path)
    spec = spec.replace("URL", h.endpoint)
    want = strata("logits", "--model", repo / local, "--ids", ids())["last_logits"]
    assert logits(spec, env, tmp_path / "cache") == want


def test_text_generation_uses_the_remote_files_tokenizer(hub, tmp_path):
    h, repo = hub
    env = remote_env(h, tmp_path)
    args = ["--prompt", "Hello there", "--max-tokens", "8", "--temperature", "0", "--ignore-eos"]
    local = run("run", "--model", repo / "M-Q8_0.gguf", *args).stdout
    remote = run("run", "--model", "hf://test/g:Q8_0", "--cache-dir", tmp_path / "c", *args, env=env).stdout
    assert remote == local and remote.strip()


def test_a_header_arrives_in_steps_and_a_cached_model_runs_offline(hub, tmp_path):
    h, repo = hub
    env = {**remote_env(h, tmp_path), "STRATA_GGUF_FIRST_BYTES": "4096"}
    cache = tmp_path / "cache"
    before = len(h.requests("/M-Q8_0.gguf"))
    want = strata("logits", "--model", repo / "M-Q8_0.gguf", "--ids", ids())["last_logits"]
    assert logits("hf://test/g:Q8_0", env, cache) == want
    ranged = [line for line in h.requests("/M-Q8_0.gguf")[before:] if line.startswith("206 ")]
    starts = [int(line.split("range=bytes=")[1].split("-")[0]) for line in ranged]
    # 8 bytes (the size), then the rest of 4 KiB, 16 KiB, ... until the header parses.
    assert len([s for s in starts if s < 64 << 10]) >= 3, ranged
    assert len(starts) == len(set(starts)), f"a byte range was asked for twice: {ranged}"
    # Again: everything is cached, nothing is asked for.
    before = len(h.requests("/M-Q8_0.gguf"))
    assert logits("hf://test/g:Q8_0", env, cache) == want
    assert len(h.requests("/M-Q8_0.gguf")) == before
    h.stop()
    try:
        offline = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
        assert logits("hf://test/g:Q8_0", offline, cache, "--offline") == want
        p = run("logits", "--model", "hf://test/g:BF16", "--ids", ids(), "--cache-dir", cache, "--offline",
                env=offline, ok=False)
        assert p.returncode != 0 and "offline" in p.stderr, p.stderr
    finally:
        h.start()


def test_a_tag_the_repository_lacks_lists_the_ones_it_has(hub, tmp_path):
    h, _ = hub
    env = remote_env(h, tmp_path)
    p = run("logits", "--model", "hf://test/g:Q4_K_M", "--ids", "1", "--cache-dir", tmp_path / "c", env=env,
            ok=False)
    assert p.returncode != 0
    assert "no GGUF file tagged Q4_K_M" in p.stderr and "BF16, Q8_0" in p.stderr, p.stderr
    p = run("logits", "--model", "hf://test/g/README.md", "--ids", "1", "--cache-dir", tmp_path / "c", env=env,
            ok=False)
    assert p.returncode != 0 and "not a .gguf file" in p.stderr, p.stderr


def test_pull_fetches_the_picked_files_whole(hub, tmp_path):
    h, repo = hub
    env = remote_env(h, tmp_path)
    cache = tmp_path / "cache"
    run("pull", "hf://test/g:BF16", "--cache-dir", cache, env=env)
    snapshot = cache / "models" / "hf--test--g" / "snapshots" / COMMIT
    for i in (1, 2, 3):
        name = f"M-BF16-0000{i}-of-00003.gguf"
        assert (snapshot / name).read_bytes() == (repo / "BF16" / name).read_bytes()
