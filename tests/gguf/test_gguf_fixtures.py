"""GGUF files made from the fixtures with the `gguf` package (`scripts/hf-to-gguf.py`) give the
fixtures' goldens through the `strata` binary: logits within the fixture's tolerance, argmax
where the margin decides it, greedy generations, and the tokenizer and chat template that the
GGUF carries (ids, tokens' text, rendered chats) equal to the `tokenizer.json` results.

Every fixture with goldens, BF16 weights and a `model_type` the converter maps is converted
three times (F32, F16, BF16). The binary is $STRATA_BIN (else target/{release,debug}/strata);
fixtures are $STRATA_FIXTURES (else ../shared/fixtures).
"""

import json
import subprocess
import sys

import pytest

from helpers import CONVERTED, CONVERTER, MLA, bf16_fixtures, csv, fixtures_dir, strata

FIXTURES = bf16_fixtures()


def test_the_fixtures_include_a_converted_family():
    assert FIXTURES, f"no fixture under {fixtures_dir()} has a model_type in {sorted(CONVERTED)}"


def variants():
    out = []
    for d in FIXTURES:
        out += [(d, t, []) for t in ("f32", "f16", "bf16")]
        if json.loads((d / "config.json").read_text())["model_type"] in MLA:
            out.append((d, "bf16", ["--whole-kv-b"]))
    return out


@pytest.fixture(scope="module", params=variants(), ids=lambda p: "-".join([p[0].name, p[1], *p[2]]))
def gguf_model(request, tmp_path_factory):
    folder, outtype, extra = request.param
    out = tmp_path_factory.mktemp("gguf") / f"{folder.name}-{outtype}.gguf"
    cmd = [sys.executable, str(CONVERTER), str(folder), str(out), "--outtype", outtype, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return folder, out, json.loads((folder / "golden.json").read_text())


def rel_tolerance(g):
    return g.get("tolerances", {}).get("logits", {}).get("rel_f32_engine", 1e-3)


def test_logits_and_argmax_match_the_goldens(gguf_model):
    folder, model, g = gguf_model
    rel = rel_tolerance(g)
    for p, prompt in enumerate(g["prompts"]):
        out = strata("logits", "--model", model, "--ids", csv(prompt["ids"]))
        absmax = prompt["last_logits_absmax"]
        worst = max(abs(a - b) for a, b in zip(out["last_logits"], prompt["last_logits"]))
        assert len(out["last_logits"]) == len(prompt["last_logits"])
        assert worst <= rel * absmax, f"{folder.name} prompt {p}: max |diff| {worst} > {rel} x {absmax}"
        for i, (a, b, m) in enumerate(zip(out["argmax"], prompt["argmax"], prompt["top2_margin"])):
            if m >= 2 * rel * absmax:
                assert a == b, f"{folder.name} prompt {p}: argmax at {i}"


def test_greedy_generations_match_the_goldens(gguf_model):
    folder, model, g = gguf_model
    rel = rel_tolerance(g)
    for entry in g["generation"]:
        absmax = g["prompts"][entry["prompt_index"]]["last_logits_absmax"]
        want = entry["new_ids"]
        out = strata("run", "--model", model, "--ids", csv(entry["prompt_ids"]), "--max-tokens", len(want),
                     "--temperature", 0, "--ignore-eos", "--output", "json")
        margins = entry["step_top2_margin"]
        checked = next((i + 1 for i, m in enumerate(margins) if m < 2 * rel * absmax), len(margins))
        assert out["token_ids"][:checked] == want[:checked], f"{folder.name}: generation"
        assert isinstance(out["text"], str)


def test_the_gguf_tokenizer_and_template_match_the_goldens(gguf_model, tmp_path):
    folder, model, g = gguf_model
    for case in g["tokenizer"]:
        text = case["text"]
        assert strata("tokenize", "--model", model, "--text", text)["ids"] == case["ids"], text
        plus = strata("tokenize", "--model", model, "--text", text, "--add-special")["ids"]
        assert plus == case["ids_add_special_tokens"], text
        if case["ids"]:
            ids = csv(case["ids"])
            assert strata("detokenize", "--model", model, "--ids", ids)["text"] == case["decoded"], text
            skip = strata("detokenize", "--model", model, "--ids", ids, "--skip-special")["text"]
            assert skip == case["decoded_skip_special"], text
    for n, case in enumerate(g["chat_template"]):
        messages = tmp_path / f"chat{n}.json"
        messages.write_text(json.dumps(case["messages"]))
        args = ["tokenize", "--model", model, "--chat", messages]
        if case["add_generation_prompt"]:
            args.append("--add-generation-prompt")
        args += ["--template-kwargs", json.dumps(case["extra_template_kwargs"])]
        out = strata(*args)
        assert out["text"] == case["rendered"], f"chat case {n}"
        assert out["ids"] == case["ids"], f"chat case {n}"
