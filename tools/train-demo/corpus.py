#!/usr/bin/env python3
"""The demo model's corpus, from public-domain and freely licensed English text that Debian
packages ship (SOURCES.md lists them and their licences):

  - the King James Bible (`bible-kjv`: its `bible` program prints the text), one chapter a
    paragraph, verse numbers dropped;
  - WordNet 3.0's glosses (`wordnet-base`), each as a definition line ("dog: a domesticated
    carnivorous mammal ...") and, for a share of them, as a question and answer in the chat
    format, so the model answers in turn with `--chat`.

    apt-get install bible-kjv wordnet-base
    python3 tools/train-demo/corpus.py OUT_DIR

Writes OUT_DIR/train.txt and OUT_DIR/valid.txt (every 50th document held out): documents
separated by a blank line, the Bible's chapters twice in train.txt (they are the running prose;
the glosses are three quarters of the bytes). Deterministic.
"""

import random
import re
import subprocess
import sys
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
# The chat format of the model's template (tokenizer.py writes the same markers).
USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"


def bible():
    """The chapters, each one paragraph."""
    text = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters, current = [], []
    for line in text.splitlines():
        if re.fullmatch(r"[1-3]? ?[A-Z][A-Za-z ]+ \d+", line.strip()):
            if current:
                chapters.append(" ".join(current))
            current = []
            continue
        line = re.sub(r"^\s*\d+\s+", "", line).strip()
        if line:
            current.append(line)
    if current:
        chapters.append(" ".join(current))
    return chapters


def wordnet():
    """(words, gloss) of every synset, definitions and examples as WordNet gives them."""
    out = []
    for part in ("noun", "verb", "adj", "adv"):
        for line in (WORDNET / f"data.{part}").read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue
            head, gloss = line.split(" | ", 1)
            fields = head.split()
            n = int(fields[3], 16)
            words = [fields[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\(.*\)$", "", w) for w in words]
            out.append((words, gloss.strip()))
    return out


def definition_docs(synsets, rng):
    docs = []
    for words, gloss in synsets:
        definition, *examples = [g.strip() for g in gloss.split(";")]
        examples = [e.strip('"') for e in examples if e.startswith('"')]
        word = words[0]
        line = f"{word}: {definition}."
        if examples:
            line += " For example: " + "; ".join(examples) + "."
        docs.append(line)
        if rng.random() < 0.3:
            answer = f"{word[:1].upper()}{word[1:]} means {definition}."
            if len(words) > 1:
                answer += " It is also called " + ", ".join(words[1:3]) + "."
            docs.append(f"{USER}What does \"{word}\" mean?{END}{ASSISTANT}{answer}{END}")
    return docs


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    chapters = bible()
    docs = chapters + definition_docs(wordnet(), rng)
    rng.shuffle(docs)
    valid = [d for i, d in enumerate(docs) if i % 50 == 0]
    train = [d for i, d in enumerate(docs) if i % 50 != 0]
    prose = set(chapters)
    train += [d for d in train if d in prose]
    rng.shuffle(train)
    (out / "train.txt").write_text("\n\n".join(train) + "\n")
    (out / "valid.txt").write_text("\n\n".join(valid) + "\n")
    size = sum(len(d) for d in docs)
    print(f"{len(docs)} documents, {size / 1e6:.1f} MB: {len(train)} to train on, {len(valid)} held out")


if __name__ == "__main__":
    main()
