"""The Hugging Face cache layout, both ways, against a real nginx serving a fixture model as the
hub does (`/{repo}/resolve/{revision}/{file}` with `X-Repo-Commit`):

- `strata pull` writes what it fetched whole into the hub cache (`blobs/`, `snapshots/`,
  `refs/`), and `huggingface_hub` loads it offline (`hf_hub_download`, `snapshot_download` with
  `local_files_only=True`);
- files `huggingface_hub` downloaded are what strata runs offline, the branch resolved from the
  hub cache's `refs/main`."""

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import fixtures, strata_bin
from nginx_hub import COMMIT, Nginx

MODEL = "qwen3-moe-tiny"


@pytest.fixture
def hub(tmp_path):
    """nginx serving the fixture as hf://test/m; yields its endpoint."""
    # A copy whose files have distinct times: nginx's ETag is time and size, and huggingface_hub
    # names blobs by ETag (the hub's are content hashes), so equal-sized shards written in the
    # same second would share one blob.
    model = tmp_path / "model"
    shutil.copytree(fixtures() / MODEL, model)
    for i, f in enumerate(sorted(model.iterdir())):
        os.utime(f, (1_700_000_000 + i, 1_700_000_000 + i))
    www = tmp_path / "www" / "test" / "m" / "resolve"
    www.mkdir(parents=True)
    for rev in ("main", COMMIT):
        (www / rev).symlink_to(model)
    server = Nginx(tmp_path, "/test/m/resolve/main/config.json").start()
    yield server.endpoint
    server.stop()


def model_files():
    d = fixtures() / MODEL
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    small = [f for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                         "model.safetensors.index.json") if (d / f).exists()]
    return small + shards


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def strata(*args, env):
    out = subprocess.run([strata_bin(), *args], env={**os.environ, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def test_what_strata_pulls_huggingface_hub_loads_offline(hub, tmp_path):
    from huggingface_hub import hf_hub_download, snapshot_download

    hf_home = tmp_path / "hf"
    env = {"HF_ENDPOINT": hub, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0"}
    out = strata("pull", "test/m", "--cache-dir", str(tmp_path / "strata"), env=env)
    assert "shared with the Hugging Face cache" in out.stderr, out.stderr
    cache = hf_home / "hub"
    assert (cache / "models--test--m" / "refs" / "main").read_text().strip() == COMMIT
    src = fixtures() / MODEL
    for f in model_files():
        got = hf_hub_download("test/m", f, cache_dir=cache, local_files_only=True)
        assert sha(got) == sha(src / f), f
    snap = Path(snapshot_download("test/m", cache_dir=cache, local_files_only=True))
    assert sorted(p.name for p in snap.iterdir()) == sorted(model_files())
    # Blobs are hard links to strata's cached files: no second copy on disk.
    shard = snap / model_files()[-1]
    assert os.stat(shard).st_nlink >= 2


def test_what_huggingface_hub_downloads_strata_runs_offline(hub, tmp_path):
    from huggingface_hub import hf_hub_download

    hf_home = tmp_path / "hf"
    for f in model_files():
        hf_hub_download("test/m", f, cache_dir=hf_home / "hub", endpoint=hub)
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(hf_home)}
    ids = ["--ids", "1,2,3", "-n", "4", "--temp", "0", "--output", "json"]
    # An empty strata cache, no network: the branch comes from the hub cache's refs/main.
    got = strata("run", "hf://test/m", "--offline", "--cache-dir", str(tmp_path / "empty"), *ids, env=env)
    want = strata("run", str(fixtures() / MODEL), *ids, env=env)
    assert json.loads(got.stdout) == json.loads(want.stdout)


def test_a_hub_model_is_served_as_org_name(hub, tmp_path):
    from conftest import Server

    env = {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    s = Server("hf://test/m", env=env)
    try:
        assert [m.id for m in s.client().models.list().data] == ["test/m"]
    finally:
        s.stop()
