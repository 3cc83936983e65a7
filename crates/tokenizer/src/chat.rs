//! Chat templates from `tokenizer_config.json` (or `chat_template.jinja`), rendered by minijinja
//! with the environment transformers gives Jinja: trim_blocks, lstrip_blocks, loop controls,
//! `raise_exception`, `strftime_now`, `namespace`, Python string/dict methods, and a `tojson`
//! that writes what Python's `json.dumps` writes.

use std::path::Path;

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};

use crate::pyjson::python_json_dumps;
use crate::{Result, TokenizerError};

const TEMPLATE_NAME: &str = "chat";

pub struct ChatTemplate {
    env: Environment<'static>,
    pub source: String,
}

fn raise_exception(message: String) -> std::result::Result<JValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

fn tojson(value: JValue, kwargs: Kwargs) -> std::result::Result<JValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Other json.dumps options (ensure_ascii, sort_keys, separators) are accepted and ignored.
    for key in ["ensure_ascii", "sort_keys", "separators"] {
        let _: Option<JValue> = kwargs.get(key)?;
    }
    kwargs.assert_all_used()?;
    Ok(JValue::from_safe_string(python_json_dumps(&value, indent)?))
}

impl ChatTemplate {
    pub fn new(source: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TokenizerError::Template(format!("does not compile: {e:#}")))?;
        Ok(ChatTemplate { env, source })
    }

    /// The template of a folder: `chat_template.jinja`, else `chat_template` in the config (a
    /// string, or a list of named templates of which `default` is taken).
    pub fn from_dir(dir: &Path, config: &Value) -> Result<Option<ChatTemplate>> {
        let file = dir.join("chat_template.jinja");
        if file.exists() {
            let source = std::fs::read_to_string(&file).map_err(|e| TokenizerError::file(&file, e))?;
            return Ok(Some(ChatTemplate::new(source)?));
        }
        let source = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
            _ => None,
        };
        source.map(ChatTemplate::new).transpose()
    }

    /// Renders `messages` (a JSON list of message objects). `special_tokens` and `kwargs` become
    /// template variables (kwargs win); `tools` is passed as `tools` (none when absent), as
    /// transformers does. Message keys whose value is null are kept (OpenAI clients send
    /// `content: null` on tool-call turns).
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        special_tokens: &Map<String, Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<String> {
        let mut ctx = special_tokens.clone();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        template
            .render(JValue::from_serialize(&ctx))
            .map_err(|e| TokenizerError::Template(format!("{e:#}")))
    }
}
