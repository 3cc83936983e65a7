//! Tokenizer and chat-template goldens: the fixture models' tokenizers and the real tokenizers in
//! `fixtures/tokenizers/`. Everything must match exactly.

use serde_json::Value;
use strata_testkit::{as_u32s, fixture, golden, read_json};
use strata_tokenizer::{TiktokenBackend, Tokenizer, KIMI_PATTERN};

const MODEL_FOLDERS: &[&str] = &[
    "deepseek-v3-tiny",
    "deepseek-v3-tiny-fp8",
    "kimi-k2-tiny",
    "kimi-k2-tiny-int4",
    "qwen3-moe-tiny",
    "mixtral-tiny",
    "kimi-linear-tiny",
];

/// ids, ids with special tokens added, token strings, decodings: HF-style golden entries.
fn check_hf_cases(name: &str, tok: &Tokenizer, cases: &[Value]) {
    assert!(!cases.is_empty(), "{name}: no tokenizer cases in golden.json");
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = as_u32s(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), ids, "{name}: ids of {text:?}");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            as_u32s(&case["ids_add_special_tokens"]),
            "{name}: ids_add_special_tokens of {text:?}"
        );
        let tokens: Vec<String> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            tok.tokens(text, false).unwrap(),
            tokens,
            "{name}: tokens of {text:?}"
        );
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{name}: decode of {text:?}"
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "{name}: decode(skip_special) of {text:?}"
        );
    }
}

/// Chat renderings. Entries whose messages hold `null` are compared with `rendered_keep_none`
/// (transformers 4.x keeps null keys, as OpenAI clients send them); null there means an error.
fn check_chat_cases(name: &str, tok: &Tokenizer, cases: &[Value]) {
    assert!(!cases.is_empty(), "{name}: no chat cases in golden.json");
    for case in cases {
        let label = case.get("name").and_then(|n| n.as_str()).unwrap_or("?");
        let kwargs = case["extra_template_kwargs"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let tools = case.get("tools").filter(|t| !t.is_null());
        let add_gen = case["add_generation_prompt"].as_bool().unwrap();
        let result = tok.apply_chat_template(&case["messages"], tools, add_gen, &kwargs);
        let (expected, ids) = match case.get("rendered_keep_none") {
            Some(r) => (r, case.get("ids_keep_none")),
            None => (&case["rendered"], case.get("ids")),
        };
        match expected.as_str() {
            Some(want) => {
                let got = result.unwrap_or_else(|e| panic!("{name}/{label}: render failed: {e}"));
                assert_eq!(got, want, "{name}/{label}: rendering differs");
                if let Some(ids) = ids.filter(|i| !i.is_null()) {
                    assert_eq!(
                        tok.encode(&got, false).unwrap(),
                        as_u32s(ids),
                        "{name}/{label}: ids of rendering"
                    );
                }
            }
            None => assert!(
                result.is_err(),
                "{name}/{label}: the reference fails to render; strata rendered {result:?}"
            ),
        }
    }
}

#[test]
fn fixture_model_tokenizers_match_goldens() {
    for name in MODEL_FOLDERS {
        let dir = fixture(name);
        let g = golden(name);
        let tok = Tokenizer::from_dir(&dir).unwrap();
        check_hf_cases(name, &tok, g["tokenizer"].as_array().unwrap());
        check_chat_cases(name, &tok, g["chat_template"].as_array().unwrap());
    }
}

#[test]
fn real_hf_tokenizers_match_goldens() {
    for name in ["tokenizers/deepseek-v3", "tokenizers/qwen3"] {
        let dir = fixture(name);
        let g = read_json(&dir.join("golden.json"));
        let tok = Tokenizer::from_dir(&dir).unwrap();
        check_hf_cases(name, &tok, g["tokenizer"].as_array().unwrap());
        check_chat_cases(name, &tok, g["chat_template"].as_array().unwrap());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn check_tiktoken_cases(name: &str, tok: &Tokenizer, cases: &[Value], pattern: &str) {
    let tik = tok.as_tiktoken().unwrap();
    let splitter = fancy_regex::Regex::new(pattern).unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = as_u32s(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), ids, "{name}: ids of {text:?}");
        assert_eq!(
            tik.encode_ordinary(text).unwrap(),
            as_u32s(&case["ids_specials_as_text"]),
            "{name}: ids_specials_as_text of {text:?}"
        );
        let hexes: Vec<String> = ids.iter().map(|&id| hex(tik.token_bytes(id).unwrap())).collect();
        let want: Vec<String> = case["token_bytes_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap().to_string())
            .collect();
        assert_eq!(hexes, want, "{name}: token bytes of {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{name}: decode of {text:?}"
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "{name}: decode(skip) of {text:?}"
        );
        if let Some(pieces) = case.get("pieces_specials_as_text") {
            let got: Vec<&str> = splitter.find_iter(text).map(|m| m.unwrap().as_str()).collect();
            let want: Vec<&str> = pieces
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            assert_eq!(got, want, "{name}: pre-tokenizer pieces of {text:?}");
        }
    }
}

#[test]
fn kimi_style_tiktoken_matches_goldens() {
    let dir = fixture("tokenizers/tiktoken-kimi-style");
    let g = read_json(&dir.join("golden.json"));
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let spec = read_json(&dir.join("kimi_tiktoken.json"));
    assert_eq!(tok.vocab_size(), spec["n_vocab"].as_u64().unwrap() as usize);
    assert_eq!(
        spec["pat_str"].as_str().unwrap(),
        KIMI_PATTERN,
        "built-in Kimi pattern differs from the fixture's"
    );
    check_tiktoken_cases(
        "tiktoken-kimi-style",
        &tok,
        g["tokenizer"].as_array().unwrap(),
        KIMI_PATTERN,
    );
}

#[test]
fn qwen_tiktoken_matches_goldens() {
    let dir = fixture("tokenizers/tiktoken-qwen");
    let g = read_json(&dir.join("golden.json"));
    let spec = read_json(&dir.join("qwen_tiktoken.json"));
    let pattern = spec["pat_str"].as_str().unwrap();
    let specials = spec["special_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["content"].as_str().unwrap().to_string(),
                s["id"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    let backend = TiktokenBackend::from_rank_file(&dir.join("qwen.tiktoken"), pattern, specials).unwrap();
    let tok = Tokenizer::from_tiktoken(backend);
    check_tiktoken_cases("tiktoken-qwen", &tok, g["tokenizer"].as_array().unwrap(), pattern);
}

/// Kimi K3: the tiktoken rank file with K3's eight-way pattern (from tokenizer_config.json),
/// its specials, and an XTML chat prompt, against the project's reference (`k3ref-golden-v1`).
#[test]
fn kimi_k3_tokenizer_and_xtml_match_reference() {
    let dir = fixture("kimi-k3-tiny");
    let g = golden("kimi-k3-tiny");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let tik = tok.as_tiktoken().unwrap();
    let cases = g["tokenizer_tests"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = as_u32s(&case["ids"]);
        let got = if case["allow_special"].as_bool().unwrap_or(false) {
            tok.encode(text, false).unwrap()
        } else {
            tik.encode_ordinary(text).unwrap()
        };
        assert_eq!(got, want, "k3 tokenizer: {text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), text, "k3 decode: {text:?}");
    }
    // The chat prompt: its messages are not stored, only the rendered segments; rebuild the
    // conversation from them (one user message) and render it ourselves.
    let chat = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "chat")
        .expect("chat prompt");
    let segments = chat["segments"].as_array().unwrap();
    let user_text = segments
        .iter()
        .map(|s| s.as_array().unwrap())
        .find(|s| s[1] == false && s[0] != "message" && !s[0].as_str().unwrap().starts_with("message "))
        .map(|s| s[0].as_str().unwrap().to_string())
        .expect("user text segment");
    let messages = serde_json::json!([{"role": "user", "content": user_text}]);
    let (ids, text) = tok
        .encode_chat(&messages, None, true, &Default::default())
        .unwrap();
    assert_eq!(ids, as_u32s(&chat["ids"]), "k3 XTML prompt ids");
    assert!(
        text.starts_with("[BOS]<|open|>message role=\"user\"<|sep|>"),
        "{text}"
    );
    // Special-token text inside a message stays ordinary text.
    let tricky = serde_json::json!([{"role": "user", "content": "<|open|>"}]);
    let (ids, _) = tok
        .encode_chat(&tricky, None, false, &Default::default())
        .unwrap();
    let open = tok.token_to_id("<|open|>").unwrap();
    assert_eq!(
        ids.iter().filter(|&&i| i == open).count(),
        1,
        "only the structural open"
    );
}

/// A million repeated characters: the split pattern may give up (fancy-regex's backtracking
/// limit), which is an error naming the tokenizer, never a panic; whatever encodes decodes back.
#[test]
fn pathological_input_is_an_error_or_tokens_never_a_panic() {
    let inputs = [
        " ".repeat(1_000_000),
        format!("{}x", " ".repeat(1_000_000)),
        "!".repeat(1_000_000),
    ];
    for name in [
        "tokenizers/qwen3",
        "tokenizers/deepseek-v3",
        "tokenizers/tiktoken-kimi-style",
        "kimi-k3-tiny",
    ] {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        for text in &inputs {
            match tok.encode(text, false) {
                Ok(ids) => assert_eq!(tok.decode(&ids, false).unwrap(), *text, "{name}"),
                Err(e) => assert!(e.to_string().starts_with("tokenizer:"), "{name}: {e}"),
            }
            if let Some(tik) = tok.as_tiktoken() {
                let _ = tik.encode_ordinary(text).map_err(|e| e.to_string());
            }
        }
    }
    // Through a chat rendering too (Kimi K3's XTML encodes each segment with the pattern).
    let tok = Tokenizer::from_dir(&fixture("kimi-k3-tiny")).unwrap();
    let messages = serde_json::json!([{"role": "user", "content": " ".repeat(1_000_000)}]);
    let r = tok.encode_chat(&messages, None, true, &Default::default());
    if let Err(e) = r {
        assert!(e.to_string().contains("tokenizer"), "{e}");
    }
}

/// A long run of tokens that never complete a character (a lone UTF-8 continuation byte, over
/// and over) is released lossily every few tokens, not held (and re-decoded) to the end.
#[test]
fn broken_utf8_is_released_within_a_bounded_window() {
    let tok = Tokenizer::from_dir(&fixture("qwen3-moe-tiny")).unwrap();
    let lone = (0..256u32)
        .find(|&id| tok.decode(&[id], false).unwrap() == "\u{FFFD}")
        .expect("a byte token that is not UTF-8 on its own");
    let mut d = strata_tokenizer::StreamDecoder::new(false);
    let (mut out, mut held) = (String::new(), 0);
    for _ in 0..5000 {
        match d.push(&tok, lone).unwrap() {
            Some(text) => {
                out.push_str(&text);
                held = 0;
            }
            None => held += 1,
        }
        assert!(held < strata_tokenizer::MAX_HELD, "held {held} tokens");
    }
    out.push_str(&d.flush(&tok).unwrap().unwrap_or_default());
    assert!(!out.is_empty() && out.chars().all(|c| c == '\u{FFFD}'), "{out:?}");
    // Real text still streams exactly.
    let text = "héllo 😀 wörld";
    let ids = tok.encode(text, false).unwrap();
    let mut d = strata_tokenizer::StreamDecoder::new(false);
    let mut out = String::new();
    for id in ids {
        out.push_str(&d.push(&tok, id).unwrap().unwrap_or_default());
    }
    out.push_str(&d.flush(&tok).unwrap().unwrap_or_default());
    assert_eq!(out, text);
}
