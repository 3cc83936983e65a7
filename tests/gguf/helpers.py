"""What the GGUF tests share: the converter, the strata binary, the fixtures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# tests/nginx_hub.py, shared with the API suite.
sys.path.insert(0, str(REPO / "tests"))
CONVERTER = REPO / "scripts" / "hf-to-gguf.py"
# model_type values `scripts/hf-to-gguf.py` converts (its ARCHES).
CONVERTED = {
    "qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "kimi_k2", "kimi_linear", "llama", "mistral", "qwen2", "qwen3"
}
# The repository's own fixtures (dense models, Qwen2-MoE), beside the script that made them.
OWN = REPO / "tests" / "data"
# MLA fixtures (DeepSeek-style, Kimi Linear's) are also written with kv_b whole (older conversions).
MLA = {"deepseek_v3", "kimi_k2", "kimi_linear"}


def strata_bin() -> str:
    if os.environ.get("STRATA_BIN"):
        return os.environ["STRATA_BIN"]
    found = [p for p in (REPO / "target/release/strata", REPO / "target/debug/strata") if p.exists()]
    if not found:
        pytest.exit("no strata binary: run `cargo build` first or set STRATA_BIN", returncode=2)
    return str(max(found, key=lambda p: p.stat().st_mtime))


def fixtures_dir() -> Path:
    return Path(os.environ.get("STRATA_FIXTURES", REPO.parent / "shared" / "fixtures"))


def bf16_fixtures():
    out = []
    shared = sorted(fixtures_dir().iterdir()) if fixtures_dir().is_dir() else []
    for d in shared + sorted(p for p in OWN.iterdir() if p.is_dir()):
        if not (d / "golden.json").exists() or not (d / "config.json").exists():
            continue
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("model_type") in CONVERTED and not cfg.get("quantization_config"):
            out.append(d)
    return out


def strata(*args):
    p = subprocess.run([strata_bin(), *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, f"strata {' '.join(map(str, args))} failed:\n{p.stderr}"
    return json.loads(p.stdout)


def csv(ids):
    return ",".join(map(str, ids))
