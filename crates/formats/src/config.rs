//! `config.json` and `generation_config.json`. Families read their hyperparameters through the
//! typed accessors of [`JsonConfig`], so a missing or mistyped key is reported with the file and
//! key name instead of a generic deserialisation error.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{FormatError, Result};

#[derive(Clone, Debug)]
pub struct JsonConfig {
    pub path: PathBuf,
    pub value: Value,
}

impl JsonConfig {
    pub fn read(path: &Path) -> Result<JsonConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<JsonConfig> {
        let value: Value = serde_json::from_str(text).map_err(|e| FormatError::BadJson {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })?;
        if !value.is_object() {
            return Err(FormatError::BadJson {
                path: path.to_path_buf(),
                reason: "top level must be a JSON object".into(),
            });
        }
        Ok(JsonConfig {
            path: path.to_path_buf(),
            value,
        })
    }

    fn err(&self, key: &str, reason: impl Into<String>) -> FormatError {
        FormatError::BadKey {
            path: self.path.clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// The value of a key, `None` when absent or JSON `null`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "missing (required by this architecture)"))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(key, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| self.err(key, "missing (required by this architecture)"))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// A nested object such as `rope_scaling`, as its own config (errors then name `outer.inner`).
    pub fn opt_object(&self, key: &str) -> Result<Option<JsonConfig>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.is_object() => Ok(Some(JsonConfig {
                path: PathBuf::from(format!("{} ({key})", self.path.display())),
                value: v.clone(),
            })),
            Some(v) => Err(self.err(key, format!("expected an object, found {v}"))),
        }
    }

    /// The language model's config: `text_config` when the root wraps one (multimodal
    /// checkpoints such as Kimi K3), else the root itself.
    pub fn text_config(&self) -> Result<JsonConfig> {
        Ok(self.opt_object("text_config")?.unwrap_or_else(|| self.clone()))
    }

    pub fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a list of non-negative integers")),
            Some(v) => Err(self.err(key, format!("expected a list, found {v}"))),
        }
    }

    /// A token id or a list of ids (`eos_token_id` is either).
    pub fn opt_id_list(&self, key: &str) -> Result<Option<Vec<u32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(|n| Some(vec![n as u32]))
                .ok_or_else(|| self.err(key, "expected a token id")),
            Some(_) => Ok(self
                .opt_usize_list(key)?
                .map(|ids| ids.into_iter().map(|i| i as u32).collect())),
        }
    }

    /// The first entry of `architectures`, if any.
    pub fn architecture(&self) -> Option<&str> {
        self.get("architectures")
            .and_then(|v| v.as_array())
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
    }
}

/// `generation_config.json`: the model author's defaults for decoding.
#[derive(Clone, Debug, Default)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

impl GenerationConfig {
    pub fn read(path: &Path) -> Result<GenerationConfig> {
        let cfg = JsonConfig::read(path)?;
        Ok(GenerationConfig {
            bos_token_id: cfg.opt_id_list("bos_token_id")?.and_then(|v| v.first().copied()),
            eos_token_ids: cfg.opt_id_list("eos_token_id")?.unwrap_or_default(),
            do_sample: cfg.opt_bool("do_sample")?,
            temperature: cfg.opt_f64("temperature")?,
            top_p: cfg.opt_f64("top_p")?,
            top_k: cfg.opt_usize("top_k")?,
            min_p: cfg.opt_f64("min_p")?,
            repetition_penalty: cfg.opt_f64("repetition_penalty")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_file_and_key() {
        let c = JsonConfig::parse(Path::new("config.json"), r#"{"a": 1, "b": "x", "e": [1, 2]}"#).unwrap();
        assert_eq!(c.usize("a").unwrap(), 1);
        let e = c.usize("missing").unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("`missing`"), "{e}");
        let e = c.usize("b").unwrap_err().to_string();
        assert!(e.contains("`b`") && e.contains("integer"), "{e}");
        assert_eq!(c.opt_id_list("e").unwrap(), Some(vec![1, 2]));
        assert_eq!(c.opt_id_list("a").unwrap(), Some(vec![1]));
    }
}
