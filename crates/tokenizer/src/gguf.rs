//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as
//! the `tokenizer.json` it came from: a byte-level BPE (`gpt2` model) with its merges, added
//! tokens from the token types, the pre-tokenizer that `tokenizer.ggml.pre` names; or a
//! SentencePiece vocabulary (`llama` model, `gguf_spm.rs`); BOS added when
//! `tokenizer.ggml.add_bos_token` says so (by default for SentencePiece). The special tokens and
//! template become the `tokenizer_config.json` keys the rest of the crate reads.

use serde_json::{json, Value};
use strata_formats::gguf::{Gguf, Value as Meta};

use crate::tokenizer::Tokenizer;
use crate::{ChatTemplate, Result, TokenizerError};

/// llama.cpp's token types.
pub(crate) const UNKNOWN: i64 = 2;
pub(crate) const CONTROL: i64 = 3;
pub(crate) const USER_DEFINED: i64 = 4;
/// Ids no text maps to (the padding past a vocabulary): left out, so they are never decoded
/// (and never sampled).
pub(crate) const UNUSED: i64 = 5;

/// A vocabulary's pieces of its tokenizer.json.
pub(crate) struct Parts {
    pub added: Vec<Value>,
    pub normalizer: Value,
    pub pre_tokenizer: Value,
    pub decoder: Value,
    pub model: Value,
    /// Whether BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos_default: bool,
}

/// Byte-level BPE pre-tokenizers by llama.cpp's name: (names, split patterns applied in turn,
/// NFC first).
const PRE: &[(&[&str], &[&str], bool)] = &[
    (
        &["qwen2", "deepseek-r1-qwen"],
        &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        true,
    ),
    (
        &["llama-bpe", "llama3"],
        &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        false,
    ),
    (
        &["gpt2", "default"],
        &[r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"],
        false,
    ),
    // DeepSeek-V3/R1's three splits, as its tokenizer.json has them.
    (
        &["deepseek-v3"],
        &[
            r"\p{N}{1,3}",
            "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ],
        false,
    ),
    // Kimi K2 (and Kimi Linear): its tiktoken pattern, Han runs apart.
    (&["kimi-k2"], &[crate::tiktoken::KIMI_PATTERN], false),
];

pub(crate) fn bad(g: &Gguf, key: &str, reason: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::file(&g.paths[0], format!("key `{key}`: {reason}"))
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>> {
    let list = g
        .get(key)
        .and_then(Meta::as_array)
        .ok_or_else(|| bad(g, key, "missing or not an array"))?;
    list.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| bad(g, key, "an element is not a string"))
        })
        .collect()
}

fn id(g: &Gguf, key: &str, n: usize) -> Result<Option<usize>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(i) if (i as usize) < n => Ok(Some(i as usize)),
            _ => Err(bad(
                g,
                key,
                format!("{v:?} is not a token id (the vocabulary has {n})"),
            )),
        },
    }
}

/// Whether a GGUF file carries a tokenizer.
pub fn has_tokenizer(g: &Gguf) -> bool {
    g.get("tokenizer.ggml.model").is_some()
}

/// The tokenizer of a GGUF model.
pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
    let model = g.opt_str("tokenizer.ggml.model").ok().flatten().unwrap_or("");
    if !matches!(model, "gpt2" | "llama") {
        return Err(bad(
            g,
            "tokenizer.ggml.model",
            format!(
                "vocabulary type `{model}` is not supported yet (supported: gpt2, byte-level BPE; llama, SentencePiece)"
            ),
        ));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(Meta::as_array) {
        Some(list) if list.len() == tokens.len() => list.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        Some(list) => {
            return Err(bad(
                g,
                "tokenizer.ggml.token_type",
                format!("{} types for {} tokens", list.len(), tokens.len()),
            ))
        }
        None => vec![1; tokens.len()],
    };
    let parts = if model == "llama" {
        crate::gguf_spm::parts(g, &tokens, &types)?
    } else {
        byte_level(g, &tokens, &types)?
    };
    build(g, &tokens, parts)
}

/// A byte-level BPE's pieces: its merges and the pre-tokenizer `tokenizer.ggml.pre` names.
fn byte_level(g: &Gguf, tokens: &[&str], types: &[i64]) -> Result<Parts> {
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let total_merges = merges.len();
    let pre_name = g
        .opt_str("tokenizer.ggml.pre")
        .ok()
        .flatten()
        .unwrap_or("default");
    let Some(&(_, patterns, nfc)) = PRE.iter().find(|(names, _, _)| names.contains(&pre_name)) else {
        let known: Vec<&str> = PRE.iter().flat_map(|(n, _, _)| n.iter().copied()).collect();
        return Err(bad(
            g,
            "tokenizer.ggml.pre",
            format!(
                "pre-tokenizer `{pre_name}` is not supported yet (supported: {})",
                known.join(", ")
            ),
        ));
    };

    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty == UNUSED {
            continue;
        }
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": ty == USER_DEFINED, "special": ty == CONTROL,
            }));
        }
        // Added tokens stay in the model's vocabulary too (no merge makes them): an added token
        // the vocabulary lacks gets an id after the vocabulary's last, not its own, so
        // DeepSeek's specials at ids 0 and 1 would move.
        vocab.insert(t.to_string(), json!(i));
    }
    // llama.cpp takes merges whose parts or result are not tokens (a placeholder vocabulary's
    // one merge, say) and never applies them; the BPE here refuses them, so they are left out.
    let merges: Vec<&str> = merges
        .into_iter()
        .filter(|m| {
            m.split_once(' ').is_some_and(|(a, b)| {
                vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}"))
            })
        })
        .collect();
    if merges.len() < total_merges {
        tracing::warn!(
            "{}: {} of {total_merges} merges name strings that are not tokens; left out",
            g.paths[0].display(),
            total_merges - merges.len()
        );
    }
    let byte_level =
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    Ok(Parts {
        added,
        normalizer: if nfc { json!({"type": "NFC"}) } else { Value::Null },
        pre_tokenizer: {
            let mut steps: Vec<Value> = (patterns.iter())
                .map(|p| json!({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false}))
                .collect();
            steps.push(byte_level);
            json!({"type": "Sequence", "pretokenizers": steps})
        },
        decoder: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        model: json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": merges}),
        add_bos_default: false,
    })
}

/// The tokenizer from a vocabulary's pieces: BOS, EOS, the template.
fn build(g: &Gguf, tokens: &[&str], parts: Parts) -> Result<Tokenizer> {
    let n = tokens.len();
    let bos = id(g, "tokenizer.ggml.bos_token_id", n)?;
    let eos = id(g, "tokenizer.ggml.eos_token_id", n)?;
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(Meta::as_bool)
        .unwrap_or(parts.add_bos_default);
    let post = match (add_bos, bos) {
        (true, Some(b)) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": tokens[b], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": tokens[b], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": tokens[b], "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tokens[b]: {"id": tokens[b], "ids": [b], "tokens": [tokens[b]]}},
        }),
        _ => Value::Null,
    };
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": parts.added,
        "normalizer": parts.normalizer,
        "pre_tokenizer": parts.pre_tokenizer,
        "post_processor": post,
        "decoder": parts.decoder,
        "model": parts.model,
    });
    let tok: tokenizers::Tokenizer = json.to_string().parse().map_err(|e| {
        TokenizerError::file(
            &g.paths[0],
            format!("its vocabulary does not build a tokenizer: {e}"),
        )
    })?;

    let mut config = serde_json::Map::new();
    if let Some(b) = bos {
        config.insert("bos_token".into(), json!(tokens[b]));
    }
    if let Some(e) = eos {
        config.insert("eos_token".into(), json!(tokens[e]));
    }
    config.insert("add_bos_token".into(), json!(add_bos));
    let chat_template = match g.opt_str("tokenizer.chat_template") {
        Ok(Some(source)) => Some(ChatTemplate::new(source.to_string())?),
        Ok(None) => None,
        Err(e) => return Err(TokenizerError::file(&g.paths[0], e)),
    };
    Ok(Tokenizer::from_parts(tok, Value::Object(config), chat_template))
}
