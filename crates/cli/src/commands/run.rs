//! `strata run`: prompt in, tokens out, streamed as they are generated.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use strata_runtime::{Engine, GenEvent, Request, SamplingParams};
use strata_tokenizer::Tokenizer;

use super::{parse_ids, MemArgs, ModelArg};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Stream the generated text to stdout.
    Text,
    /// Print `{"token_ids": [...], "text": "..."}` of the generated part at the end.
    Json,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).multiple(true).args(["prompt", "file", "ids", "messages"])))]
#[command(group(clap::ArgGroup::new("text").args(["prompt", "file"])))]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// The prompt text (encoded with the tokenizer's special tokens, e.g. BOS, unless --chat);
    /// `-` reads it from standard input.
    #[arg(long, short = 'p', value_name = "TEXT")]
    prompt: Option<String>,
    /// The prompt text from a file (`-`: standard input), as --prompt takes it; one final newline
    /// is dropped.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<std::path::PathBuf>,
    /// Wrap the prompt as a user message in the model's chat template (with the generation
    /// prompt).
    #[arg(long, requires = "text")]
    chat: bool,
    /// A conversation so far, as a JSON array of messages (what `strata chat`'s /save writes),
    /// put through the chat template with the generation prompt; with --chat the prompt is
    /// added as the next user message.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    messages: Option<std::path::PathBuf>,
    /// System message for --chat or --messages.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Extra chat-template variables as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long, value_name = "JSON")]
    template_kwargs: Option<String>,
    /// The prompt as token ids, comma-separated, instead of text.
    #[arg(long, value_name = "IDS", conflicts_with_all = ["prompt", "file"])]
    ids: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256, value_name = "N")]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when this text appears (not printed); may be given several times.
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

/// Sampling flags, shared by `run` and `chat`.
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy. Default: the model's generation_config.json, else 0.
    /// (`-t` is the thread count, as in llama.cpp.)
    #[arg(long, alias = "temp", value_name = "T")]
    temperature: Option<f32>,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Drop tokens less likely than P x the most likely one (0 = off).
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Penalise tokens already in the prompt or output (1 = off; 1.1 is mild).
    #[arg(long, value_name = "R")]
    repetition_penalty: Option<f32>,
    /// Random seed: the same seed and settings give the same output. Default: from the clock.
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
}

impl SamplingArgs {
    /// The flags over the model's defaults, checked.
    pub fn params(&self, engine: &Engine) -> Result<SamplingParams> {
        let d = engine.sampling_defaults();
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            seed: self.seed.unwrap_or(d.seed),
            ..d
        };
        if !(params.temperature >= 0.0 && params.temperature.is_finite()) {
            bail!("--temperature must be >= 0");
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&params.min_p) {
            bail!("--min-p must be in [0, 1]");
        }
        if !(params.repetition_penalty > 0.0 && params.repetition_penalty.is_finite()) {
            bail!("--repetition-penalty must be > 0");
        }
        Ok(params)
    }
}

/// `--template-kwargs`: a JSON object, or none.
pub fn template_kwargs(text: Option<&str>) -> Result<serde_json::Map<String, serde_json::Value>> {
    match text {
        Some(s) => match serde_json::from_str(s).context("--template-kwargs: not valid JSON")? {
            serde_json::Value::Object(m) => Ok(m),
            _ => bail!("--template-kwargs must be a JSON object"),
        },
        None => Ok(Default::default()),
    }
}

/// A conversation saved as a JSON array of messages (`{"role": ..., "content": ...}`), as
/// `strata chat`'s /save writes it.
pub fn read_messages(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))?;
    let serde_json::Value::Array(messages) = value else {
        bail!("{}: a JSON array of messages was expected", path.display());
    };
    for (i, m) in messages.iter().enumerate() {
        if !(m.get("role").is_some_and(|r| r.is_string()) && m.get("content").is_some()) {
            bail!(
                "{}: message {i} needs a \"role\" string and a \"content\"",
                path.display()
            );
        }
    }
    Ok(messages)
}

fn prompt_ids(args: &RunArgs, tok: Option<&Tokenizer>, dir: &Path) -> Result<Vec<u32>> {
    if let Some(ids) = &args.ids {
        return parse_ids(ids);
    }
    let tok = tok.ok_or_else(|| strata_runtime::EngineError::NoTokenizer(dir.to_path_buf()))?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    if let Some(path) = &args.messages {
        messages.extend(read_messages(path)?);
    }
    if args.prompt.is_some() || args.file.is_some() {
        let text = prompt_text(args)?;
        if !args.chat && args.messages.is_none() {
            return Ok(tok.encode(&text, true)?);
        }
        messages.push(json!({"role": "user", "content": text}));
    }
    let kwargs = template_kwargs(args.template_kwargs.as_deref())?;
    Ok(tok
        .encode_chat(&serde_json::Value::Array(messages), None, true, &kwargs)?
        .0)
}

/// The prompt's text: `--prompt TEXT`, or read from `--file FILE` or standard input (`-`).
fn prompt_text(args: &RunArgs) -> Result<String> {
    let read = |path: &Path| -> Result<String> {
        let mut text = if path == Path::new("-") {
            std::io::read_to_string(std::io::stdin()).context("reading the prompt from standard input")?
        } else {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompt from {}", path.display()))?
        };
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        Ok(text)
    };
    match (&args.file, args.prompt.as_deref()) {
        (Some(path), _) => read(path),
        (None, Some("-")) => read(Path::new("-")),
        (None, Some(text)) => Ok(text.to_string()),
        (None, None) => bail!("give the prompt: --prompt TEXT, --file FILE or --ids IDS"),
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    if (args.system.is_some() || args.template_kwargs.is_some()) && !args.chat && args.messages.is_none() {
        bail!("--system and --template-kwargs go with --chat or --messages");
    }
    let t_load = Instant::now();
    // The prompt first: its length and --max-tokens are the positions the plan reserves.
    let opened = args.model.open()?;
    let dir = opened.0.clone();
    let tokenizer = Engine::tokenizer_of(&dir)?;
    let prompt = prompt_ids(&args, tokenizer.as_ref(), &dir)?;
    let mut load = args.mem.load_options();
    load.positions = Some(prompt.len().saturating_add(args.max_tokens));
    let engine = args.model.load_opened(opened, &load, tokenizer)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let request = Request {
        prompt,
        max_new_tokens: args.max_tokens,
        sampling: args.sampling.params(&engine)?,
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
    };
    if !args.stop.is_empty() && engine.tokenizer.is_none() {
        bail!("--stop needs a tokenizer, and {} has none", dir.display());
    }

    let stdout = std::io::stdout();
    let mut text = String::new();
    let mut first_token = None;
    let t_gen = Instant::now();
    // A long prompt shows its progress until the first token.
    let bar = std::cell::RefCell::new(super::bars::PromptBar::default());
    let turn = engine.generate_in(
        &mut strata_runtime::Session::new(),
        &request,
        |event| {
            if let GenEvent::Token { text: delta, .. } = event {
                if first_token.is_none() {
                    bar.borrow_mut().finish();
                    first_token = Some(Instant::now());
                }
                text.push_str(delta);
                if args.output == Output::Text {
                    let mut out = stdout.lock();
                    let _ = out.write_all(delta.as_bytes());
                    let _ = out.flush();
                }
            }
            true
        },
        |done, total| bar.borrow_mut().update(done, total),
    );
    bar.borrow_mut().finish();
    let turn = turn?;
    let (ids, reason) = (turn.generated, turn.finish);
    let total_s = t_gen.elapsed().as_secs_f64();
    match args.output {
        Output::Text => println!(),
        Output::Json => println!(
            "{}",
            serde_json::to_string(&json!({"token_ids": ids, "text": text}))?
        ),
    }
    let prefill_s = first_token.map_or(total_s, |t| (t - t_gen).as_secs_f64());
    let decode_s = total_s - prefill_s;
    eprintln!(
        "[strata] load {load_s:.2} s | prompt {} tokens in {prefill_s:.2} s | {} tokens generated ({:.2} tok/s after the first) | finish: {}",
        request.prompt.len(),
        ids.len(),
        if ids.len() > 1 && decode_s > 0.0 { (ids.len() - 1) as f64 / decode_s } else { 0.0 },
        reason.map_or("?", |r| r.as_str()),
    );
    Ok(())
}
