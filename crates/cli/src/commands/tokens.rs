//! `logits`, `tokenize`, `detokenize`: the JSON interfaces external checks and users debugging
//! templates rely on. Keep their output stable.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::json;
use strata_tokenizer::Tokenizer;

use super::{parse_ids, MemArgs, ModelArg};

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// Token ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_name = "IDS")]
    ids: String,
}

pub fn logits(args: LogitsArgs) -> Result<()> {
    let ids = parse_ids(&args.ids)?;
    let (engine, _) = args.model.load(&args.mem.load_options())?;
    let out = engine.logits(&ids)?;
    let body = json!({"argmax": out.argmax, "last_logits": out.last_logits});
    println!("{}", serde_json::to_string(&body)?);
    Ok(())
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "chat"])))]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Text to encode. Special-token text (e.g. <|im_end|>) becomes its id.
    #[arg(long, value_name = "TEXT")]
    text: Option<String>,
    /// Add what the tokenizer adds for add_special_tokens=true (e.g. BOS). Only with --text.
    #[arg(long, requires = "text")]
    add_special: bool,
    /// A JSON file with a list of chat messages (or an object with `messages` and optional
    /// `tools`), rendered with the model's chat template and then encoded.
    #[arg(long, value_name = "MESSAGES.json")]
    chat: Option<PathBuf>,
    /// End the rendering with the assistant's turn opener. Only with --chat.
    #[arg(long, requires = "chat")]
    add_generation_prompt: bool,
    /// Extra template variables as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long, value_name = "JSON", requires = "chat")]
    template_kwargs: Option<String>,
}

pub fn tokenize(args: TokenizeArgs) -> Result<()> {
    let dir = args.model.resolve()?;
    let tok = Tokenizer::from_dir(&dir)?;
    let (ids, text) = if let Some(text) = args.text {
        (tok.encode(&text, args.add_special)?, text)
    } else {
        let path = args.chat.expect("clap requires --text or --chat");
        let raw = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&raw).with_context(|| format!("{}: not valid JSON", path.display()))?;
        let (messages, tools) = match &value {
            serde_json::Value::Array(_) => (value.clone(), None),
            serde_json::Value::Object(o) if o.contains_key("messages") => (
                o["messages"].clone(),
                o.get("tools").filter(|t| !t.is_null()).cloned(),
            ),
            _ => bail!(
                "{}: expected a list of messages or an object with `messages`",
                path.display()
            ),
        };
        let kwargs = match &args.template_kwargs {
            Some(s) => match serde_json::from_str::<serde_json::Value>(s)
                .context("--template-kwargs: not valid JSON")?
            {
                serde_json::Value::Object(m) => m,
                _ => bail!("--template-kwargs must be a JSON object"),
            },
            None => Default::default(),
        };
        tok.encode_chat(&messages, tools.as_ref(), args.add_generation_prompt, &kwargs)?
    };
    println!("{}", serde_json::to_string(&json!({"ids": ids, "text": text}))?);
    Ok(())
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Token ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_name = "IDS")]
    ids: String,
    /// Leave out special tokens (BOS, EOS, chat markers).
    #[arg(long)]
    skip_special: bool,
}

pub fn detokenize(args: DetokenizeArgs) -> Result<()> {
    let ids = parse_ids(&args.ids)?;
    let dir = args.model.resolve()?;
    let tok = Tokenizer::from_dir(&dir)?;
    let text = tok.decode(&ids, args.skip_special)?;
    println!("{}", serde_json::to_string(&json!({"text": text}))?);
    Ok(())
}
