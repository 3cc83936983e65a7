"""Kimi Linear as llama.cpp's converter writes it (`kimi-linear`: KDA tensors under `ssm_*`
names, `ssm_a` = -exp(A_log), one KV head count per layer). The goldens run through
`test_gguf_fixtures.py` and `test_gguf_quantized.py`; here, what is particular to the family:
`strata inspect` reads the experts of the GGUF as those of the folder it came from, and a decay
rate that cannot be -exp(x) is an error naming the GGUF tensor."""

import subprocess
import sys

import gguf
import pytest

from helpers import CONVERTER, fixtures_dir, strata_bin

SOURCE = fixtures_dir() / "kimi-linear-tiny"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not SOURCE.is_dir():
        pytest.fail(f"no fixture {SOURCE} (set STRATA_FIXTURES)")
    out = tmp_path_factory.mktemp("gguf-kl") / "kimi-linear-bf16.gguf"
    subprocess.run([sys.executable, str(CONVERTER), str(SOURCE), str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def inspect_lines(model):
    p = subprocess.run([strata_bin(), "inspect", "--model", str(model)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    keep = ("layers ", "experts ", "bytes per expert", "uncached token")
    return [line for line in p.stdout.splitlines() if line.startswith(keep)]


def test_inspect_reads_the_same_experts_as_from_the_folder(model):
    got, want = inspect_lines(model), inspect_lines(SOURCE)
    assert len(want) == 4, want
    assert got == want


def test_a_decay_rate_that_is_not_negative_names_the_tensor(model, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(model.read_bytes())
    reader = gguf.GGUFReader(bad, "r+")
    (a,) = [t for t in reader.tensors if t.name == "blk.2.ssm_a"]
    a.data[...] = -a.data  # exp(A_log) where -exp(A_log) belongs
    reader.data.flush()
    del reader
    p = subprocess.run([strata_bin(), "logits", "--model", str(bad), "--ids", "1,2,3"], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "panicked" not in p.stderr
    assert "blk.2.ssm_a" in p.stderr and "bad.gguf" in p.stderr, p.stderr
