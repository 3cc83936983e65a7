//! Incremental detokenization for streaming: text is released only once it is complete UTF-8,
//! so a character split across tokens (emoji, CJK in byte-level BPE) is never emitted broken.
//! Each push decodes a short window (the last released run of tokens and those held since), and
//! after [`MAX_HELD`] tokens that complete no character, what they hold is released lossily
//! (U+FFFD), so a run of broken UTF-8 never makes decoding quadratic.

use crate::{Result, Tokenizer};

/// Tokens held back at most while they complete no character (a character is at most 4 bytes,
/// so real text never holds this many).
pub const MAX_HELD: usize = 8;

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
        } else if self.ids.len() - self.read >= MAX_HELD {
            let delta = String::from_utf8_lossy(after.as_bytes().get(before.len()..).unwrap_or_default());
            let delta = delta.into_owned();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(Some(delta).filter(|d| !d.is_empty()))
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
