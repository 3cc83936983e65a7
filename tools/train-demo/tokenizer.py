#!/usr/bin/env python3
"""The demo model's tokenizer: a byte-level BPE of 4096 tokens trained on its corpus (Qwen2's
split pattern, so GGUF conversions name the `qwen2` pre-tokenizer), with the chat markers as
special tokens and a chat template that uses them.

    python3 tools/train-demo/tokenizer.py CORPUS_DIR OUT_DIR

Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json. Needs `tokenizers`.
"""

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

VOCAB = 4096
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOT, SYSTEM, USER, ASSISTANT, END = "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIALS = [EOT, SYSTEM, USER, ASSISTANT, END]
TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- '<|system|>' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '<|user|>' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- '<|assistant|>' + message['content'] + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)


def documents(path):
    """The corpus's documents (blank-line separated), without the chat markers (the trainer
    must not merge across them)."""
    text = path.read_text()
    for doc in text.split("\n\n"):
        for marker in SPECIALS:
            doc = doc.replace(marker, "\n")
        yield doc


def main():
    corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS), min_frequency=2, show_progress=False, special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents(corpus / "train.txt"), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for t in SPECIALS}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": EOT,
        "eos_token": END,
        "pad_token": EOT,
        "unk_token": None,
        "chat_template": TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"{tok.get_vocab_size()} tokens; ids: " + ", ".join(f"{t} {tok.token_to_id(t)}" for t in SPECIALS))


if __name__ == "__main__":
    main()
