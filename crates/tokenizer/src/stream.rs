//! Incremental detokenization for streaming: text is released only once it is complete UTF-8,
//! so a character split across tokens (emoji, CJK in byte-level BPE) is never emitted broken.

use crate::{Result, Tokenizer};

/// Decodes a growing list of ids into text deltas.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context (a few tokens before `read`).
    prefix: usize,
    /// Ids before this have been emitted.
    read: usize,
    skip_special: bool,
}

impl StreamDecoder {
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder {
            skip_special,
            ..Default::default()
        }
    }

    /// Adds one id; returns the text it completes, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = tok.decode(&self.ids[self.prefix..], self.skip_special)?;
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') && after.is_char_boundary(before.len())
        {
            let delta = after[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(Some(delta))
        } else {
            Ok(None)
        }
    }

    /// Whatever is still held back (lossy: an unfinished character becomes U+FFFD).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>> {
        if self.read == self.ids.len() {
            return Ok(None);
        }
        let before = tok.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = tok.decode(&self.ids[self.prefix..], self.skip_special)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(after
            .get(before.len()..)
            .map(str::to_string)
            .filter(|s| !s.is_empty()))
    }
}
