//! The embedded demo model writes English: a 64-token greedy continuation of each fixed prompt,
//! through the binary with no `--model`, is at least 80 % dictionary words (Debian's
//! `wamerican` list, `/usr/share/dict/american-english`; `STRATA_DICT` names another). Its
//! logits against transformers' are checked with the other quantized models' goldens
//! (`strata-demo` in `strata_testkit::QUANTIZED_MODELS`).

use std::collections::HashSet;
use std::process::Command;

const PROMPTS: &[&str] = &[
    "The king said",
    "And it came to pass",
    "In the beginning",
    "water:",
];

fn dictionary() -> HashSet<String> {
    let path = std::env::var("STRATA_DICT").unwrap_or_else(|_| "/usr/share/dict/american-english".into());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{path}: {e}: the English test needs a word list (`apt-get install wamerican`, or STRATA_DICT)"
        )
    });
    text.lines().map(|w| w.trim().to_lowercase()).collect()
}

fn continuation(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "--max-tokens", "64", "--temperature", "0", "--ignore-eos"])
        .args(args)
        .output()
        .expect("spawn strata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 text")
}

/// The share of `text`'s words (runs of letters) found in `words`, and how many there are.
fn english(text: &str, words: &HashSet<String>) -> (f64, usize) {
    let all: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let known = all.iter().filter(|w| words.contains(*w)).count();
    (known as f64 / all.len().max(1) as f64, all.len())
}

#[test]
fn the_demo_model_writes_english() {
    let words = dictionary();
    for prompt in PROMPTS {
        let text = continuation(&["--prompt", prompt]);
        let (share, n) = english(&text, &words);
        eprintln!(
            "{prompt:?} -> {text:?}: {:.0} % of {n} words in the dictionary",
            share * 100.0
        );
        assert!(n >= 20, "{prompt:?}: only {n} words: {text:?}");
        assert!(
            share >= 0.8,
            "{prompt:?}: {:.0} % dictionary words: {text:?}",
            share * 100.0
        );
    }
    // Through the chat template too: it answers in turn.
    let text = continuation(&["--chat", "--prompt", "What does \"river\" mean?"]);
    let (share, n) = english(&text, &words);
    assert!(n >= 3 && share >= 0.8, "chat: {text:?}");
}

#[test]
fn noise_is_not_english() {
    // The measure itself: random letters fail it, a sentence passes.
    let words = dictionary();
    assert!(english("qzx vbnt lkjw the", &words).0 < 0.5);
    assert_eq!(english("And the king said unto them", &words), (1.0, 6));
}
