"""Real vocabularies as GGUF files carry them, against the reference libraries' goldens
(`fixtures/tokenizers`): DeepSeek-V3's own byte-level BPE under llama.cpp's `deepseek-v3`
pre-tokenizer (three splits in turn), and a Kimi-style tiktoken vocabulary written as llama.cpp's
Kimi converters write one (each token's bytes as byte-level text, the merges recovered from the
ranks, the 256 special ids after them) under `kimi-k2` (Kimi K2 and Kimi Linear GGUF files). A
GGUF holding only the vocabulary is enough for `strata tokenize`. Every golden string is checked
but the one holding a NUL byte, which a command line cannot carry."""

import base64
import importlib.util
import json
import sys

import gguf
import pytest

from helpers import REPO, fixtures_dir, strata

TOKENIZERS = fixtures_dir() / "tokenizers"


def write(path, add):
    w = gguf.GGUFWriter(str(path), "llama")
    add(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def converter():
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("hf_to_gguf", REPO / "scripts" / "hf-to-gguf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def byte_text():
    """GPT-2's byte-level alphabet: byte -> the character a vocabulary writes for it."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def merged_pair(ranks, token):
    """The two parts BPE joins last to make `token`: merge the lowest-ranked adjacent pair while
    its rank is below the token's own."""
    parts = [bytes([b]) for b in token]
    own = ranks[token]
    while len(parts) > 2:
        best = min(
            ((ranks.get(a + b, own), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))),
            default=(own, 0),
        )
        if best[0] >= own:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts if len(parts) == 2 else None


def add_tiktoken_vocab(w, folder):
    ranks = {}
    for line in (folder / "tiktoken.model").read_text().splitlines():
        if line.strip():
            piece, rank = line.split()
            ranks[base64.b64decode(piece)] = int(rank)
    text = byte_text()
    as_text = lambda bs: "".join(text[b] for b in bs)
    base = len(ranks)
    tokens = [None] * base
    merges = []
    for token, rank in ranks.items():
        tokens[rank] = as_text(token)
        if len(token) > 1:
            pair = merged_pair(ranks, token)
            if pair:
                merges.append(f"{as_text(pair[0])} {as_text(pair[1])}")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    named = {int(i): t["content"] for i, t in config["added_tokens_decoder"].items()}
    tokens += [named.get(i, f"<|reserved_token_{i}|>") for i in range(base, base + 256)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * base + [gguf.TokenType.CONTROL] * 256)
    w.add_token_merges(merges)
    w.add_bos_token_id(base)
    w.add_eos_token_id(base + 1)


@pytest.fixture(scope="module", params=["deepseek-v3", "tiktoken-kimi-style"])
def vocab(request, tmp_path_factory):
    folder = TOKENIZERS / request.param
    if not folder.is_dir():
        pytest.fail(f"no {folder} (set STRATA_FIXTURES)")
    out = tmp_path_factory.mktemp("vocab") / f"{request.param}.gguf"
    if request.param == "deepseek-v3":
        write(out, lambda w: converter().add_vocab(w, folder, 0))
    else:
        write(out, lambda w: add_tiktoken_vocab(w, folder))
    return out, json.loads((folder / "golden.json").read_text())["tokenizer"]


def test_the_pre_tokenizer_is_llama_cpps_name(vocab):
    model, _ = vocab
    field = gguf.GGUFReader(model).fields["tokenizer.ggml.pre"]
    name = bytes(field.parts[field.data[0]]).decode()
    assert name in ("deepseek-v3", "kimi-k2")


def test_ids_and_decoding_equal_the_reference(vocab):
    model, cases = vocab
    checked = 0
    for case in cases:
        if "\x00" in case["text"]:
            continue  # a command line cannot carry a NUL byte
        got = strata("tokenize", "--model", model, "--text", case["text"])["ids"]
        assert got == case["ids"], f"{case['name']}: {case['text'][:60]!r}"
        checked += 1
    assert checked >= len(cases) - 1
    for case in cases[:8]:
        if case["ids"]:
            ids = ",".join(map(str, case["ids"]))
            assert strata("detokenize", "--model", model, "--ids", ids)["text"] == case["decoded"], case["name"]
