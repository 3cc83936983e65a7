//! A GGUF SentencePiece vocabulary (`tokenizer.ggml.model` = `llama`: Llama 1/2, Mistral,
//! Mixtral, ...) rebuilt as the `tokenizer.json` transformers makes of such a model: a BPE
//! over `▁`-for-space pieces with byte fallback (`<0x0A>` ...), whose merges come from the
//! pieces' scores (every split of a piece into two pieces, the higher the piece's score the
//! earlier, as transformers' `SentencePieceExtractor` orders them), the text prefixed with
//! `▁` when `tokenizer.ggml.add_space_prefix` says so (the default), and a decoder that undoes
//! all of it.

use std::collections::HashMap;

use serde_json::{json, Value};
use strata_formats::gguf::{Gguf, Value as Meta};

use crate::gguf::{bad, Parts, CONTROL, UNKNOWN, UNUSED, USER_DEFINED};
use crate::Result;

const SPACE: &str = "\u{2581}";

/// The pieces of a SentencePiece vocabulary's tokenizer.json.
pub(crate) fn parts(g: &Gguf, tokens: &[&str], types: &[i64]) -> Result<Parts> {
    let scores: Vec<f64> = match g.get("tokenizer.ggml.scores").and_then(Meta::as_array) {
        Some(list) if list.len() == tokens.len() => list.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
        Some(list) => {
            return Err(bad(
                g,
                "tokenizer.ggml.scores",
                format!("{} scores for {} tokens", list.len(), tokens.len()),
            ))
        }
        None => {
            return Err(bad(
                g,
                "tokenizer.ggml.scores",
                "missing (a SentencePiece vocabulary needs them)",
            ))
        }
    };
    let mut vocab = serde_json::Map::new();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut added = Vec::new();
    let mut unk = None;
    for (i, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty == UNUSED {
            continue;
        }
        if ty == UNKNOWN {
            unk.get_or_insert(t);
        }
        if ty == CONTROL || ty == USER_DEFINED || ty == UNKNOWN {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": ty == USER_DEFINED, "special": ty != USER_DEFINED,
            }));
        }
        // Every piece stays in the model's vocabulary too, as transformers keeps it.
        vocab.insert(t.to_string(), json!(i));
        ids.insert(t, i); // a repeated piece is its last id, as in the vocabulary
    }
    let merges = merges(tokens, types, &scores, &ids);
    let prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(Meta::as_bool)
        .unwrap_or(true);
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE});
    let normalizer = if prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]})
    } else {
        replace
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(Parts {
        added,
        normalizer,
        pre_tokenizer: Value::Null,
        decoder: json!({"type": "Sequence", "decoders": decoders}),
        model: json!({"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                      "ignore_merges": false, "vocab": vocab, "merges": merges}),
        add_bos_default: true,
    })
}

/// Every split of every piece into two pieces, the pieces in id order and each one's splits by
/// the ids of their halves, then stably by the piece's score, highest first.
fn merges(tokens: &[&str], types: &[i64], scores: &[f64], ids: &HashMap<&str, usize>) -> Vec<String> {
    let mut all: Vec<(f64, usize, usize, String)> = Vec::new();
    for (i, &piece) in tokens.iter().enumerate() {
        if types[i] == UNUSED {
            continue;
        }
        let mut local: Vec<(usize, usize, String)> = (piece.char_indices().skip(1))
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*ids.get(l)?, *ids.get(r)?, format!("{l} {r}")))
            })
            .collect();
        local.sort_by_key(|&(l, r, _)| (l, r));
        all.extend(local.into_iter().map(|(l, r, m)| (scores[i], l, r, m)));
    }
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    all.into_iter().map(|(_, _, _, m)| m).collect()
}
