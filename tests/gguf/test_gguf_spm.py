"""A GGUF whose vocabulary is SentencePiece (`tokenizer.ggml.model` = `llama`, as Llama 2,
Mistral and Mixtral files carry it): strata's encoding equals the `sentencepiece` library's on
the same model, BOS added as llama.cpp does, and decoding gives the text back.

The SentencePiece model is trained here (BPE with byte fallback and a dummy prefix, as Llama's),
on the Python reference manual's text, and written into a GGUF of a fixture model by
`scripts/hf-to-gguf.py --spm-model`.
"""

import json
import subprocess
import sys

import pytest

from helpers import CONVERTER, bf16_fixtures, strata

import sentencepiece  # tests/gguf/requirements.txt installs it

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing spaces   ",
    "multiple    internal     spaces",
    "tabs\tand\ttabs\t\t!",
    "line one\nline two\n\n\nline five",
    "1234567890 and 3.14159",
    "don't won't I'll we've",
    "你好，世界！ Привет, мир! café naïve",
    "emoji: 👍 🤖 🎉",
    "def main(argv):\n    return sum(x * 2 for x in argv if x)",
    "",
]


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    from pydoc_data.topics import topics

    tmp = tmp_path_factory.mktemp("spm")
    lines = [ln for ln in "\n".join(topics[k] for k in sorted(topics)).splitlines() if ln.strip()]
    prefix = tmp / "spm"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines[:20000]), model_prefix=str(prefix), vocab_size=1000, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_file=f"{prefix}.model")
    # Any fixture with an embedding of at least the vocabulary's rows carries it.
    folder = next(d for d in bf16_fixtures() if json.loads((d / "config.json").read_text())["vocab_size"] >= 1000)
    out = tmp / "spm.gguf"
    subprocess.run([sys.executable, str(CONVERTER), str(folder), str(out), "--outtype", "bf16",
                    "--spm-model", f"{prefix}.model"], check=True, stdout=subprocess.DEVNULL)
    return sp, out


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_equals_sentencepiece(spm_gguf, text):
    sp, model = spm_gguf
    got = strata("tokenize", "--model", model, "--text", text, "--add-special")["ids"]
    assert got == [sp.bos_id()] + sp.encode(text), text
    plain = strata("tokenize", "--model", model, "--text", text)["ids"]
    assert plain == sp.encode(text), text


@pytest.mark.parametrize("text", [t for t in TEXTS if t])  # no ids: a usage error
def test_decoding_gives_the_text_back(spm_gguf, text):
    sp, model = spm_gguf
    ids = sp.encode(text)
    got = strata("detokenize", "--model", model, "--ids", ",".join(map(str, ids)))
    assert got["text"] == sp.decode(ids), text
