//! Output held to a grammar (structured output): a request's [`Guide`] (a JSON schema, or any
//! JSON object) is compiled by llguidance against the model's vocabulary, and at every step the
//! tokens that cannot continue a match are masked out before sampling; once the grammar is
//! complete, only the end-of-sequence token is left. The logits themselves are untouched, so a
//! guided sequence's batch-mates are not affected.
//!
//! The vocabulary's bytes come from `tokenizer.json` (byte-level BPE or byte fallback) or, for a
//! tiktoken vocabulary, from the tokenizer itself; special tokens are marked so no grammar's
//! text matches them. Built once per engine, on first use.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use strata_tokenizer::Tokenizer;

/// What a request's output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Guide {
    /// A JSON value matching this JSON schema (`{"type": "object"}`: any JSON object).
    JsonSchema(Value),
    /// Text matching this Lark grammar (llguidance's dialect).
    Lark(String),
}

/// The vocabulary as llguidance needs it.
pub struct Guidance {
    factory: ParserFactory,
}

impl std::fmt::Debug for Guidance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guidance")
    }
}

/// Each token's bytes, special tokens marked with llguidance's 0xFF.
fn token_bytes(dir: &Path, tok: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u8>>, String> {
    let path = dir.join("tokenizer.json");
    let mut bytes = if tok.as_tiktoken().is_none() && path.is_file() {
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let json: Value = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        // The conversion asserts on shapes it does not know: a panic there is this file's error.
        match catch_unwind(AssertUnwindSafe(|| {
            llguidance::token_bytes_from_tokenizer_json(&json)
        })) {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Err(format!("{}: {e}", path.display())),
            Err(_) => {
                return Err(format!(
                    "{}: a vocabulary structured output cannot read",
                    path.display()
                ))
            }
        }
    } else {
        let specials = tok.special_ids();
        (0..vocab as u32)
            .map(|id| {
                let text = tok.decode(&[id], false).unwrap_or_default().into_bytes();
                if specials.contains(&id) {
                    [vec![TokTrie::SPECIAL_TOKEN_MARKER], text].concat()
                } else {
                    text
                }
            })
            .collect()
    };
    // Ids the model has past the tokenizer's (padding) can never be matched.
    bytes.resize(vocab.max(bytes.len()), Vec::new());
    bytes.truncate(vocab);
    Ok(bytes)
}

impl Guidance {
    /// The vocabulary of the model in `dir` (`vocab` ids; `eos` ends a completed grammar).
    pub fn new(dir: &Path, tok: &Tokenizer, vocab: usize, eos: u32) -> Result<Guidance, String> {
        let words = token_bytes(dir, tok, vocab)?;
        let info = TokRxInfo::new(vocab as u32, eos);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Guidance { factory })
    }

    /// A matcher for one sequence; an error names what the guide's compiler refused.
    pub fn matcher(&self, guide: &Guide) -> Result<Matcher, String> {
        let grammar = match guide {
            Guide::JsonSchema(schema) => {
                // Compact JSON unless the schema says otherwise: whitespace a model may add
                // without end would let a weak model never finish.
                let mut schema = schema.clone();
                if let Value::Object(o) = &mut schema {
                    o.entry("x-guidance")
                        .or_insert(serde_json::json!({"whitespace_flexible": false}));
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Guide::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| "the grammar compiler failed on it".to_string())?
            .map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(e),
            None => Ok(m),
        }
    }
}

/// One sequence's matcher in use.
pub(crate) struct Guided(pub Matcher);

impl Guided {
    /// Masks out of `logits` every token that cannot continue the match (only EOS once it is
    /// complete).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = self.0.compute_mask_or_eos().map_err(|e| e.to_string())?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Takes the sampled token.
    pub fn take(&mut self, id: u32) -> Result<(), String> {
        self.0.consume_token(id).map_err(|e| e.to_string())
    }

    /// Whether the grammar is complete (nothing but EOS may follow).
    pub fn done(&self) -> bool {
        self.0.is_stopped()
    }
}
