//! `strata chat`: a conversation in the terminal. Each turn puts the whole conversation through
//! the model's chat template and feeds only what the conversation's cache does not hold yet
//! (`strata_runtime::Session`), so a turn costs its new tokens. Ctrl-C stops the answer being
//! written (what was written stays in the conversation); at the prompt it says how to leave.
//! Lines are edited with history (rustyline) on a terminal, read plainly from a pipe.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use strata_runtime::{Engine, GenEvent, Request, Session};
use strata_tokenizer::Tokenizer;

use super::run::{read_messages, template_kwargs, SamplingArgs};
use super::{MemArgs, ModelArg};

#[derive(clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// System message (also `/system TEXT` during the chat).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Start from a saved conversation (a JSON array of messages, as /save writes).
    #[arg(long, value_name = "FILE")]
    messages: Option<PathBuf>,
    /// Extra chat-template variables as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long, value_name = "JSON")]
    template_kwargs: Option<String>,
    /// Most tokens per answer (an answer also ends at the end-of-turn token or the context's end).
    #[arg(long, short = 'n', default_value_t = 4096, value_name = "N")]
    max_tokens: usize,
    /// Keep answering past the end-of-turn token (to the length limit).
    #[arg(long, hide = true)]
    ignore_eos: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Where the line history is kept. Default: chat_history in the cache folder.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

const HELP: &str = "/reset        forget the conversation (the system message stays)
/system TEXT  set the system message and start over
/save FILE    write the conversation as JSON (strata run --messages FILE reads it)
/bye          leave (also /exit, /quit, Ctrl-D)
A line ending in \\ goes on on the next line. Ctrl-C stops an answer.";

/// Set by Ctrl-C while an answer is being written.
static STOP: AtomicBool = AtomicBool::new(false);
/// Whether an answer is being written (else Ctrl-C ends the program, as usual).
static ANSWERING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if ANSWERING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

fn catch_ctrl_c() {
    // SAFETY: a plain handler that touches only atomics and _exit; SA_RESTART so reads go on.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
}

/// Where lines come from.
enum Lines {
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    Plain(std::io::StdinLock<'static>),
}

impl Lines {
    fn open(history: Option<PathBuf>) -> Lines {
        if std::io::stdin().is_terminal() {
            if let Ok(mut editor) = rustyline::DefaultEditor::new() {
                if let Some(h) = &history {
                    let _ = editor.load_history(h);
                }
                return Lines::Editor(Box::new(editor), history);
            }
        }
        Lines::Plain(std::io::stdin().lock())
    }

    /// The next line; None at the end of input.
    fn next(&mut self, prompt: &str) -> Result<Option<String>> {
        match self {
            Lines::Editor(editor, _) => loop {
                match editor.readline(prompt) {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => {
                        eprintln!("(Ctrl-D or /bye to leave)");
                    }
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(e) => return Err(e).context("reading the terminal"),
                }
            },
            Lines::Plain(stdin) => {
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading standard input")? == 0 {
                    return Ok(None);
                }
                let trimmed = line.trim_end_matches(['\n', '\r']).len();
                line.truncate(trimmed);
                Ok(Some(line))
            }
        }
    }

    /// A message: lines joined while they end in a backslash.
    fn message(&mut self) -> Result<Option<String>> {
        let mut text = String::new();
        let mut prompt = ">>> ";
        loop {
            let Some(line) = self.next(prompt)? else {
                return Ok((!text.is_empty()).then_some(text));
            };
            match line.strip_suffix('\\') {
                Some(part) => {
                    text.push_str(part);
                    text.push('\n');
                    prompt = "... ";
                }
                None => {
                    text.push_str(&line);
                    return Ok(Some(text));
                }
            }
        }
    }

    fn save_history(&mut self) {
        if let Lines::Editor(editor, Some(path)) = self {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = editor.save_history(path);
        }
    }
}

/// The conversation and what renders it.
struct Conversation {
    system: Option<String>,
    messages: Vec<Value>,
    kwargs: serde_json::Map<String, Value>,
}

impl Conversation {
    fn all(&self) -> Vec<Value> {
        let system = self
            .system
            .iter()
            .map(|s| json!({"role": "system", "content": s}));
        system.chain(self.messages.iter().cloned()).collect()
    }

    fn prompt(&self, tok: &Tokenizer) -> Result<Vec<u32>> {
        Ok(tok
            .encode_chat(&Value::Array(self.all()), None, true, &self.kwargs)?
            .0)
    }
}

pub fn chat(args: ChatArgs) -> Result<()> {
    let (engine, dir) = args.model.load(&args.mem.load_options())?;
    let tok = engine
        .tokenizer
        .as_ref()
        .ok_or_else(|| strata_runtime::EngineError::NoTokenizer(dir.clone()))?;
    let mut conv = Conversation {
        system: args.system.clone(),
        messages: match &args.messages {
            Some(path) => read_messages(path)?,
            None => Vec::new(),
        },
        kwargs: template_kwargs(args.template_kwargs.as_deref())?,
    };
    let sampling = args.sampling.params(&engine)?;
    let history = args.history.clone().unwrap_or_else(|| {
        let cache = args.model.cache_dir.clone();
        cache
            .unwrap_or_else(strata_remote::default_cache_dir)
            .join("chat_history")
    });
    let mut lines = Lines::open(Some(history));
    let interactive = matches!(lines, Lines::Editor(..));
    if interactive {
        eprintln!(
            "strata chat with {}: /help for commands, Ctrl-C stops an answer, Ctrl-D or /bye leaves.",
            args.model.describe()
        );
    }
    catch_ctrl_c();
    let mut session = Session::new();
    while let Some(text) = lines.message()? {
        let line = text.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            match command_of(command, &mut conv, &mut session)? {
                Flow::Go => continue,
                Flow::Leave => break,
            }
        }
        conv.messages.push(json!({"role": "user", "content": text}));
        let request = Request {
            prompt: conv.prompt(tok)?,
            max_new_tokens: args.max_tokens,
            sampling: sampling.clone(),
            stop: Vec::new(),
            ignore_eos: args.ignore_eos,
        };
        match answer(&engine, &mut session, &request) {
            Ok(reply) => conv.messages.push(json!({"role": "assistant", "content": reply})),
            Err(e) => {
                conv.messages.pop();
                eprintln!("error: {e:#}");
            }
        }
    }
    lines.save_history();
    Ok(())
}

enum Flow {
    Go,
    Leave,
}

/// A slash command.
fn command_of(command: &str, conv: &mut Conversation, session: &mut Session) -> Result<Flow> {
    let (name, rest) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
    let rest = rest.trim();
    match name {
        "bye" | "exit" | "quit" => return Ok(Flow::Leave),
        "help" | "?" => eprintln!("{HELP}"),
        "reset" | "clear" => {
            conv.messages.clear();
            session.reset();
            eprintln!("(conversation cleared)");
        }
        "system" => {
            conv.system = (!rest.is_empty()).then(|| rest.to_string());
            conv.messages.clear();
            session.reset();
            eprintln!(
                "(system message {}; conversation cleared)",
                if rest.is_empty() { "removed" } else { "set" }
            );
        }
        "save" if rest.is_empty() => eprintln!("error: /save needs a file name"),
        "save" => {
            let text = serde_json::to_string_pretty(&Value::Array(conv.all()))?;
            match std::fs::write(rest, text + "\n") {
                Ok(()) => eprintln!("(saved {} messages to {rest})", conv.all().len()),
                Err(e) => eprintln!("error: writing {rest}: {e}"),
            }
        }
        _ => eprintln!("unknown command /{name}; /help lists them"),
    }
    Ok(Flow::Go)
}

/// Writes one answer as it comes; returns its text (as far as it went when stopped).
fn answer(engine: &Engine, session: &mut Session, request: &Request) -> Result<String> {
    let stdout = std::io::stdout();
    let mut text = String::new();
    let t0 = Instant::now();
    let mut first = None;
    STOP.store(false, Ordering::SeqCst);
    ANSWERING.store(true, Ordering::SeqCst);
    let bar = std::cell::RefCell::new(super::bars::PromptBar::default());
    let turn = engine.generate_in(
        session,
        request,
        |event| {
            if let GenEvent::Token { text: delta, .. } = event {
                if first.is_none() {
                    bar.borrow_mut().finish();
                    first = Some(Instant::now());
                }
                text.push_str(delta);
                let mut out = stdout.lock();
                let _ = out.write_all(delta.as_bytes());
                let _ = out.flush();
            }
            !STOP.load(Ordering::SeqCst)
        },
        |done, total| bar.borrow_mut().update(done, total),
    );
    bar.borrow_mut().finish();
    ANSWERING.store(false, Ordering::SeqCst);
    let turn = turn?;
    println!();
    let total = t0.elapsed().as_secs_f64();
    let prompt_s = first.map_or(total, |t| (t - t0).as_secs_f64());
    let n = turn.generated.len();
    let rate = if n > 1 && total > prompt_s {
        (n - 1) as f64 / (total - prompt_s)
    } else {
        0.0
    };
    eprintln!(
        "[strata] prompt {} new tokens ({} cached) in {prompt_s:.2} s | {n} tokens ({rate:.2} tok/s after the first) | finish: {}",
        turn.fed,
        turn.reused,
        turn.finish.map_or("interrupted", |r| r.as_str()),
    );
    Ok(text)
}
