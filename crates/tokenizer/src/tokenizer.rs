//! The tokenizer of a model folder, whichever layout it ships, behind one type.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::tiktoken::TiktokenBackend;
use crate::xtml;
use crate::{ChatTemplate, Result, TokenizerError};

enum Backend {
    Hf(Box<tokenizers::Tokenizer>),
    Tiktoken(Box<TiktokenBackend>),
}

#[derive(Clone, Debug)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    pub special: bool,
}

pub struct Tokenizer {
    backend: Backend,
    /// `tokenizer_config.json` (empty object when absent).
    config: Value,
    chat_template: Option<ChatTemplate>,
}

/// A special token in tokenizer_config.json is a string or an `AddedToken` object.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`, or `tiktoken.model` (Kimi layout), plus `tokenizer_config.json`.
    /// A GGUF file (`dir` names the file) gives the tokenizer it carries.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        if strata_formats::gguf::is_gguf(dir) {
            let g = strata_formats::gguf::Gguf::open(dir).map_err(|e| TokenizerError::file(dir, e))?;
            return crate::gguf::from_gguf(&g);
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = if config_path.exists() {
            let text =
                std::fs::read_to_string(&config_path).map_err(|e| TokenizerError::file(&config_path, e))?;
            serde_json::from_str(&text)
                .map_err(|e| TokenizerError::file(&config_path, format!("not valid JSON: {e}")))?
        } else {
            Value::Object(Default::default())
        };
        let hf_path = dir.join("tokenizer.json");
        let backend = if hf_path.exists() {
            let tok =
                tokenizers::Tokenizer::from_file(&hf_path).map_err(|e| TokenizerError::file(&hf_path, e))?;
            Backend::Hf(Box::new(tok))
        } else if dir.join("tiktoken.model").exists() {
            Backend::Tiktoken(Box::new(TiktokenBackend::kimi(dir, &config)?))
        } else {
            return Err(TokenizerError::NotFound {
                dir: dir.to_path_buf(),
            });
        };
        let chat_template = ChatTemplate::from_dir(dir, &config)?;
        Ok(Tokenizer {
            backend,
            config,
            chat_template,
        })
    }

    /// A Hugging Face tokenizer built elsewhere (a GGUF file's vocabulary), with the
    /// `tokenizer_config.json` keys and template that came with it.
    pub fn from_parts(
        tok: tokenizers::Tokenizer,
        config: Value,
        chat_template: Option<ChatTemplate>,
    ) -> Tokenizer {
        Tokenizer {
            backend: Backend::Hf(Box::new(tok)),
            config,
            chat_template,
        }
    }

    /// A tiktoken tokenizer from its parts (rank file, pattern, specials), with no config.
    pub fn from_tiktoken(backend: TiktokenBackend) -> Tokenizer {
        Tokenizer {
            backend: Backend::Tiktoken(Box::new(backend)),
            config: Value::Object(Default::default()),
            chat_template: None,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Hf(t) => t.get_vocab_size(true),
            Backend::Tiktoken(t) => t.vocab_size(),
        }
    }

    /// Whether `id` names a token (a model's vocabulary may be padded past its tokenizer's, and
    /// a tokenizer's added tokens may leave gaps).
    pub fn can_decode(&self, id: u32) -> bool {
        match &self.backend {
            Backend::Hf(t) => t.id_to_token(id).is_some(),
            Backend::Tiktoken(t) => (id as usize) < t.vocab_size(),
        }
    }

    /// Text -> ids. Special-token text always maps to its id; `add_special` adds what the
    /// tokenizer's post-processor adds (e.g. BOS), as transformers' `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Hf(t) => t
                .encode(text, add_special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
            Backend::Tiktoken(t) => t.encode(text),
        }
    }

    /// Token strings as the tokenizer names them (byte-level symbols for BPE tokenizers; for
    /// tiktoken, the bytes as lossy UTF-8).
    pub fn tokens(&self, text: &str, add_special: bool) -> Result<Vec<String>> {
        match &self.backend {
            Backend::Hf(t) => t
                .encode(text, add_special)
                .map(|e| e.get_tokens().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
            Backend::Tiktoken(t) => Ok(t
                .encode(text)?
                .iter()
                .map(|&id| String::from_utf8_lossy(t.token_bytes(id).unwrap_or_default()).into_owned())
                .collect()),
        }
    }

    /// Ids -> text. Invalid UTF-8 (a token sequence cut inside a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let vocab = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::UnknownId { id, vocab });
        }
        match &self.backend {
            Backend::Hf(t) => t
                .decode(ids, skip_special)
                .map_err(|e| TokenizerError::Encode(e.to_string())),
            Backend::Tiktoken(t) => {
                Ok(String::from_utf8_lossy(&t.decode_bytes(ids, skip_special)?).into_owned())
            }
        }
    }

    /// The tiktoken backend, when the tokenizer is one (for its specials-as-text encoding).
    pub fn as_tiktoken(&self) -> Option<&TiktokenBackend> {
        match &self.backend {
            Backend::Tiktoken(t) => Some(t),
            Backend::Hf(_) => None,
        }
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        match &self.backend {
            Backend::Hf(t) => t.token_to_id(text),
            Backend::Tiktoken(t) => t.token_to_id(text),
        }
    }

    /// Ids of the added tokens marked special (what `skip_special` removes).
    pub fn special_ids(&self) -> HashSet<u32> {
        match &self.backend {
            Backend::Hf(t) => t
                .get_added_tokens_decoder()
                .iter()
                .filter(|(_, tok)| tok.special)
                .map(|(id, _)| *id)
                .collect(),
            Backend::Tiktoken(t) => (t.num_base..t.vocab_size() as u32).collect(),
        }
    }

    /// A special token named by tokenizer_config.json (`bos_token`, `eos_token`, ...).
    pub fn config_token(&self, key: &str) -> Option<String> {
        token_text(self.config.get(key))
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The token ids of a conversation and its text: rendered with the model's chat template
    /// and encoded (the template writes its own BOS), or, for a tiktoken tokenizer with Kimi
    /// K3's structural tokens and no template, in XTML: `[BOS]` then each segment encoded on its
    /// own (special-token text inside messages stays ordinary text).
    pub fn encode_chat(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<(Vec<u32>, String)> {
        if self.chat_template.is_some() {
            let text = self.apply_chat_template(messages, tools, add_generation_prompt, kwargs)?;
            return Ok((self.encode(&text, false)?, text));
        }
        let Some(tik) = self.as_tiktoken() else {
            return Err(TokenizerError::NoTemplate);
        };
        let structural = [xtml::OPEN, xtml::SEP, xtml::CLOSE, xtml::END_OF_MSG];
        let Some(ids) = structural
            .iter()
            .map(|s| tik.token_to_id(s))
            .collect::<Option<Vec<u32>>>()
        else {
            return Err(TokenizerError::NoTemplate);
        };
        let special_id = |s: &str| ids[structural.iter().position(|x| *x == s).expect("structural token")];
        let segments = xtml::render(messages, tools, add_generation_prompt, kwargs)?;
        let mut out = Vec::new();
        let mut text = String::new();
        if let Some(bos) = self
            .config_token("bos_token")
            .and_then(|b| tik.token_to_id(&b).map(|id| (b, id)))
        {
            out.push(bos.1);
            text.push_str(&bos.0);
        }
        for seg in &segments {
            match seg {
                xtml::Segment::Special(s) => out.push(special_id(s)),
                xtml::Segment::Text(t) => out.extend(tik.encode_ordinary(t)?),
            }
        }
        text.push_str(&xtml::to_text(&segments));
        Ok((out, text))
    }

    /// Renders a conversation with the model's chat template.
    pub fn apply_chat_template(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or(TokenizerError::NoTemplate)?;
        let mut context = serde_json::Map::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            if let Some(text) = self.config_token(key) {
                context.insert(key.into(), Value::String(text));
            }
        }
        if let Some(extra) = self.config.get("additional_special_tokens") {
            context.insert("additional_special_tokens".into(), extra.clone());
        }
        template.render(messages, tools, add_generation_prompt, &context, kwargs)
    }
}
