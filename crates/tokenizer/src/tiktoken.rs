//! tiktoken rank files (`base64(bytes) rank` per line) with a split pattern and special tokens,
//! encoded by `tiktoken-rs`'s CoreBPE. Kimi K2/K3 ship `tiktoken.model` with 256 reserved special
//! ids right after the ranks, named by `tokenizer_config.json`'s `added_tokens_decoder`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use base64::Engine as _;
use tiktoken_rs::CoreBPE;

use crate::{Result, TokenizerError};

/// Kimi's pre-tokenizer pattern (from its `tokenization_kimi.py`), `&&` class intersections and all.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Kimi reserves this many special ids after the last rank.
pub const KIMI_RESERVED_SPECIALS: u32 = 256;

pub struct TiktokenBackend {
    bpe: CoreBPE,
    /// Number of ranks: ids below are BPE tokens, ids from here on are special.
    pub num_base: u32,
    /// id -> bytes, for every id (specials as their UTF-8 text).
    pieces: Vec<Vec<u8>>,
    specials: HashMap<String, u32>,
}

impl TiktokenBackend {
    /// Reads a rank file; `specials` are (text, id) pairs.
    pub fn from_rank_file(
        path: &Path,
        pattern: &str,
        specials: Vec<(String, u32)>,
    ) -> Result<TiktokenBackend> {
        let encoder = read_ranks(path)?;
        Self::new(encoder, pattern, specials).map_err(|e| TokenizerError::file(path, e))
    }

    pub fn new(
        encoder: HashMap<Vec<u8>, u32>,
        pattern: &str,
        specials: Vec<(String, u32)>,
    ) -> Result<TiktokenBackend> {
        let num_base = encoder.len() as u32;
        let n_ids = specials
            .iter()
            .map(|(_, id)| id + 1)
            .max()
            .unwrap_or(0)
            .max(num_base) as usize;
        let mut pieces = vec![Vec::new(); n_ids];
        for (bytes, &rank) in &encoder {
            if rank as usize >= n_ids {
                return Err(TokenizerError::Encode(format!(
                    "rank {rank} is not below {n_ids}: ranks must be 0..n"
                )));
            }
            pieces[rank as usize] = bytes.clone();
        }
        for (text, id) in &specials {
            pieces[*id as usize] = text.as_bytes().to_vec();
        }
        let special_map: HashMap<String, u32> = specials.into_iter().collect();
        let bpe = CoreBPE::new(
            encoder.into_iter().collect(),
            special_map.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            pattern,
        )
        .map_err(|e| TokenizerError::Encode(format!("bad split pattern or vocabulary: {e}")))?;
        Ok(TiktokenBackend {
            bpe,
            num_base,
            pieces,
            specials: special_map,
        })
    }

    /// Kimi's layout: `tiktoken.model` + `tokenizer_config.json` (`added_tokens_decoder`).
    pub fn kimi(dir: &Path, config: &serde_json::Value) -> Result<TiktokenBackend> {
        let rank_path = dir.join("tiktoken.model");
        let encoder = read_ranks(&rank_path)?;
        let num_base = encoder.len() as u32;
        let decoder = config.get("added_tokens_decoder").and_then(|v| v.as_object());
        let specials = (num_base..num_base + KIMI_RESERVED_SPECIALS)
            .map(|id| {
                let name = decoder
                    .and_then(|d| d.get(&id.to_string()))
                    .and_then(|t| t.get("content"))
                    .and_then(|c| c.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("<|reserved_token_{id}|>"));
                (name, id)
            })
            .collect();
        // A config may carry its own split pattern; Kimi's is the default.
        let pattern = ["pat_str", "k3ref_pattern"]
            .iter()
            .find_map(|k| config.get(*k).and_then(|v| v.as_str()))
            .unwrap_or(KIMI_PATTERN);
        Self::new(encoder, pattern, specials).map_err(|e| TokenizerError::file(&rank_path, e))
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_special(&self, id: u32) -> bool {
        id >= self.num_base
    }

    /// Special-token text is matched (as `allowed_special="all"`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let allowed: HashSet<&str> = self.specials.keys().map(|s| s.as_str()).collect();
        self.bpe
            .encode(text, &allowed)
            .map(|(ids, _)| ids)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Special-token text is encoded as ordinary text. A split pattern that gives up on the
    /// input (fancy-regex's backtracking limit) is an error.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>> {
        self.bpe
            .encode(text, &HashSet::new())
            .map(|(ids, _)| ids)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|p| p.as_slice())
    }

    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            let bytes = self.token_bytes(id).ok_or(TokenizerError::UnknownId {
                id,
                vocab: self.pieces.len(),
            })?;
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.specials.get(text).copied()
    }
}

fn read_ranks(path: &Path) -> Result<HashMap<Vec<u8>, u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| TokenizerError::file(path, e))?;
    let mut encoder: HashMap<Vec<u8>, u32> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (b64, rank) = line
            .split_once(' ')
            .ok_or_else(|| TokenizerError::file(path, format!("line {}: expected `base64 rank`", n + 1)))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| TokenizerError::file(path, format!("line {}: bad base64: {e}", n + 1)))?;
        let rank: u32 = rank
            .trim()
            .parse()
            .map_err(|e| TokenizerError::file(path, format!("line {}: bad rank: {e}", n + 1)))?;
        encoder.insert(bytes, rank);
    }
    Ok(encoder)
}
