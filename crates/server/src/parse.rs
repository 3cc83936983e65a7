//! Splits a chat completion's text, as it streams, into content, reasoning (`<think>...</think>`)
//! and tool calls, in each family's format:
//!
//! | format | markers |
//! |---|---|
//! | Hermes (Qwen3) | `<tool_call>{"name": .., "arguments": {..}}</tool_call>` |
//! | DeepSeek-V3 | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` (and V3.1's `...begin｜>NAME<｜tool▁sep｜>ARGS...`) |
//! | Kimi K2 | `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>` |
//!
//! Text that may be the start of a marker is held back until it is known not to be one. Once a
//! tool-call section opens, the rest of the output is collected and parsed at the end; a section
//! that does not parse is returned as content, never dropped. Other special-token text is
//! removed.

use serde_json::Value;
use strata_tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    DeepSeek,
    Kimi,
}

const HERMES_START: &str = "<tool_call>";
const DEEPSEEK_START: &str = "<｜tool▁calls▁begin｜>";
const KIMI_START: &str = "<|tool_calls_section_begin|>";
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

impl ToolFormat {
    /// The format whose markers the tokenizer has as tokens (Hermes when none: its markers work
    /// as plain text too).
    pub fn detect(tok: &Tokenizer) -> ToolFormat {
        if tok.token_to_id(KIMI_START).is_some() {
            ToolFormat::Kimi
        } else if tok.token_to_id(DEEPSEEK_START).is_some() {
            ToolFormat::DeepSeek
        } else {
            ToolFormat::Hermes
        }
    }

    fn start(self) -> &'static str {
        match self {
            ToolFormat::Hermes => HERMES_START,
            ToolFormat::DeepSeek => DEEPSEEK_START,
            ToolFormat::Kimi => KIMI_START,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The call id the model wrote (Kimi K2), if any.
    pub id: Option<String>,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
}

/// How a family marks reasoning: `<think>..</think>`, or Kimi K3's XTML elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkStyle {
    Tags,
    Xtml,
}

const XTML_THINK_OPEN: &str = "<|open|>think<|sep|>";
const XTML_THINK_CLOSE: &str = "<|close|>think<|sep|>";
/// XTML structure around the answer, removed from content.
pub const XTML_STRUCTURE: &[&str] = &[
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
];

impl ThinkStyle {
    fn open(self) -> &'static str {
        match self {
            ThinkStyle::Tags => THINK_OPEN,
            ThinkStyle::Xtml => XTML_THINK_OPEN,
        }
    }

    fn close(self) -> &'static str {
        match self {
            ThinkStyle::Tags => THINK_CLOSE,
            ThinkStyle::Xtml => XTML_THINK_CLOSE,
        }
    }

    /// Whether a rendered prompt leaves a reasoning block open.
    pub fn prompt_opens_reasoning(self, rendered: &str) -> bool {
        rendered.trim_end().ends_with(self.open())
    }
}

pub struct OutputParser {
    tools: Option<ToolFormat>,
    think: ThinkStyle,
    reasoning: bool,
    pending: String,
    /// The tool-call section so far, once it opened.
    section: Option<String>,
    /// Special-token texts removed from content.
    strip: Vec<String>,
}

fn push_piece(out: &mut Vec<Piece>, reasoning: bool, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), reasoning) {
        (Some(Piece::Reasoning(s)), true) | (Some(Piece::Content(s)), false) => s.push_str(text),
        _ => out.push(if reasoning {
            Piece::Reasoning(text.to_string())
        } else {
            Piece::Content(text.to_string())
        }),
    }
}

impl OutputParser {
    /// `tools`: parse tool calls in this format (None: tool calling is off). `in_reasoning`: the
    /// prompt left a `<think>` block open. `strip`: special-token texts to remove.
    pub fn new(tools: Option<ToolFormat>, in_reasoning: bool, strip: Vec<String>) -> OutputParser {
        Self::with_style(tools, ThinkStyle::Tags, in_reasoning, strip)
    }

    pub fn with_style(
        tools: Option<ToolFormat>,
        think: ThinkStyle,
        in_reasoning: bool,
        strip: Vec<String>,
    ) -> OutputParser {
        OutputParser {
            tools,
            think,
            reasoning: in_reasoning,
            pending: String::new(),
            section: None,
            strip: strip.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    fn markers(&self) -> Vec<&str> {
        let mut m: Vec<&str> = vec![if self.reasoning {
            self.think.close()
        } else {
            self.think.open()
        }];
        if let Some(f) = self.tools {
            m.push(f.start());
        }
        m.extend(self.strip.iter().map(String::as_str));
        m
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if let Some(section) = &mut self.section {
            section.push_str(text);
            return out;
        }
        self.pending.push_str(text);
        self.drain(&mut out, false);
        out
    }

    /// Consumes the markers in `pending`, emitting the text around them. Unless `last`, text
    /// that may still grow into a (longer) marker is kept back.
    fn drain(&mut self, out: &mut Vec<Piece>, last: bool) {
        loop {
            let markers = self.markers();
            let found = markers
                .iter()
                .filter_map(|m| self.pending.find(m).map(|at| (at, m.to_string())))
                .min_by_key(|(at, m)| (*at, std::cmp::Reverse(m.len())));
            let Some((at, marker)) = found else { break };
            // `<|close|>` may be the start of `<|close|>think<|sep|>`: wait for more text.
            let tail = &self.pending[at..];
            if !last
                && markers
                    .iter()
                    .any(|m| m.len() > marker.len() && m.starts_with(tail))
            {
                break;
            }
            let before = self.pending[..at].to_string();
            push_piece(out, self.reasoning, &before);
            let rest = self.pending[at + marker.len()..].to_string();
            self.pending.clear();
            if marker == self.think.open() && !self.reasoning {
                self.reasoning = true;
            } else if marker == self.think.close() && self.reasoning {
                self.reasoning = false;
            } else if self.tools.is_some_and(|f| f.start() == marker) {
                self.section = Some(format!("{marker}{rest}"));
                return;
            }
            self.pending = rest;
        }
        if last {
            let rest = std::mem::take(&mut self.pending);
            push_piece(out, self.reasoning, &rest);
            return;
        }
        // Keep back the longest tail that could still begin a marker.
        let markers = self.markers();
        let hold = (1..=self.pending.len())
            .rev()
            .filter(|&n| self.pending.is_char_boundary(self.pending.len() - n))
            .find(|&n| {
                let tail = &self.pending[self.pending.len() - n..];
                markers.iter().any(|m| m.starts_with(tail))
            })
            .unwrap_or(0);
        let emit = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        push_piece(out, self.reasoning, &emit);
    }

    /// The end of the output: what was held back, and the tool calls (empty when none parsed).
    pub fn finish(&mut self) -> (Vec<Piece>, Vec<ToolCall>) {
        let mut out = Vec::new();
        if self.section.is_none() {
            self.drain(&mut out, true);
        }
        let Some(section) = self.section.take() else {
            return (out, Vec::new());
        };
        let calls = match self.tools {
            Some(ToolFormat::Hermes) => parse_hermes(&section),
            Some(ToolFormat::DeepSeek) => parse_deepseek(&section),
            Some(ToolFormat::Kimi) => parse_kimi(&section),
            None => None,
        };
        match calls {
            Some(calls) if !calls.is_empty() => (out, calls),
            _ => {
                push_piece(&mut out, false, &section);
                (out, Vec::new())
            }
        }
    }
}

/// Arguments as a JSON text: objects are re-serialised, text that is not JSON is refused.
fn json_text(args: &str) -> Option<String> {
    let v: Value = serde_json::from_str(args.trim()).ok()?;
    Some(v.to_string())
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find(open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(close) else {
            out.push(after);
            break;
        };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

fn parse_hermes(section: &str) -> Option<Vec<ToolCall>> {
    between(section, HERMES_START, "</tool_call>")
        .into_iter()
        .map(|body| {
            let v: Value = serde_json::from_str(body.trim()).ok()?;
            let name = v.get("name")?.as_str()?.to_string();
            let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
                Some(Value::String(s)) => json_text(s)?,
                Some(a) => a.to_string(),
                None => "{}".into(),
            };
            Some(ToolCall {
                id: None,
                name,
                arguments,
            })
        })
        .collect()
}

fn parse_deepseek(section: &str) -> Option<Vec<ToolCall>> {
    between(section, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
        .into_iter()
        .map(|body| {
            let (head, rest) = body.split_once("<｜tool▁sep｜>")?;
            let (name, args) = if head.trim() == "function" {
                // V3: NAME\n```json\nARGS\n```
                let (name, args) = rest.split_once('\n')?;
                let args = args.trim().trim_start_matches("```json").trim_end_matches("```");
                (name.trim(), args)
            } else {
                (head.trim(), rest)
            };
            Some(ToolCall {
                id: None,
                name: name.to_string(),
                arguments: json_text(args)?,
            })
        })
        .collect()
}

fn parse_kimi(section: &str) -> Option<Vec<ToolCall>> {
    between(section, "<|tool_call_begin|>", "<|tool_call_end|>")
        .into_iter()
        .map(|body| {
            let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
            let id = id.trim();
            let name = id.strip_prefix("functions.").unwrap_or(id);
            let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
            Some(ToolCall {
                id: Some(id.to_string()),
                name: name.to_string(),
                arguments: json_text(args)?,
            })
        })
        .collect()
}

/// A whole output parsed at once: (content, reasoning, tool calls).
pub fn parse_all(p: &mut OutputParser, chunks: &[&str]) -> (String, String, Vec<ToolCall>) {
    let mut pieces = Vec::new();
    for c in chunks {
        pieces.extend(p.push(c));
    }
    let (rest, calls) = p.finish();
    pieces.extend(rest);
    let (mut content, mut reasoning) = (String::new(), String::new());
    for piece in pieces {
        match piece {
            Piece::Content(s) => content.push_str(&s),
            Piece::Reasoning(s) => reasoning.push_str(&s),
        }
    }
    (content, reasoning, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut OutputParser, chunks: &[&str]) -> (String, String, Vec<ToolCall>) {
        parse_all(p, chunks)
    }

    #[test]
    fn reasoning_and_content_split_across_chunk_boundaries() {
        let mut p = OutputParser::new(None, false, vec!["<|im_end|>".into()]);
        let (c, r, calls) = run(
            &mut p,
            &["<thi", "nk>plan", " it</th", "ink>Hi", "!<|im_", "end|>"],
        );
        assert_eq!((c.as_str(), r.as_str()), ("Hi!", "plan it"));
        assert!(calls.is_empty());
        // The prompt opened the block.
        let mut p = OutputParser::new(None, true, vec![]);
        let (c, r, _) = run(&mut p, &["why</think>\n\nbecause"]);
        assert_eq!((c.as_str(), r.as_str()), ("\n\nbecause", "why"));
    }

    #[test]
    fn each_family_format_parses() {
        let mut p = OutputParser::new(Some(ToolFormat::Hermes), false, vec![]);
        let (c, _, calls) = run(
            &mut p,
            &[
                "Sure.\n<tool",
                "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ],
        );
        assert_eq!(c, "Sure.\n");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);

        let mut p = OutputParser::new(Some(ToolFormat::DeepSeek), false, vec![]);
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let (c, _, calls) = run(&mut p, &[text]);
        assert_eq!(c, "");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("get_weather", r#"{"city":"Paris"}"#)
        );

        let mut p = OutputParser::new(Some(ToolFormat::Kimi), false, vec![]);
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
        let (_, _, calls) = run(&mut p, &[text]);
        assert_eq!(calls[0].id.as_deref(), Some("functions.get_weather:0"));
        assert_eq!(calls[0].name, "get_weather");
    }

    #[test]
    fn kimi_k3_xtml_reasoning_and_response() {
        let mut strip: Vec<String> = XTML_STRUCTURE.iter().map(|s| s.to_string()).collect();
        strip.extend(["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"].map(String::from));
        let mut p = OutputParser::with_style(None, ThinkStyle::Xtml, true, strip);
        let (c, r, _) = run(
            &mut p,
            &[
                "weigh it",
                "<|close|>",
                "think<|sep|><|open|>",
                "response<|sep|>Yes.",
                "<|close|>response<|sep|><|close|>message<|sep|>",
            ],
        );
        assert_eq!((c.as_str(), r.as_str()), ("Yes.", "weigh it"));
    }

    #[test]
    fn a_section_that_does_not_parse_stays_content() {
        let mut p = OutputParser::new(Some(ToolFormat::Hermes), false, vec![]);
        let (c, _, calls) = run(&mut p, &["<tool_call>not json"]);
        assert!(calls.is_empty());
        assert_eq!(c, "<tool_call>not json");
    }
}
