//! Model output split into content, reasoning and tool calls as it streams (first byte picks
//! the tool format and the reasoning style, pieces cut at `\u{1}`): never a panic, tool-call
//! arguments are JSON, and without a tool-call section nothing but markers is dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_server::parse::{OutputParser, Piece, ThinkStyle, ToolFormat};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let tools = [
        None,
        Some(ToolFormat::Hermes),
        Some(ToolFormat::DeepSeek),
        Some(ToolFormat::Kimi),
    ][(pick & 3) as usize];
    let think = if pick & 4 == 0 {
        ThinkStyle::Tags
    } else {
        ThinkStyle::Xtml
    };
    let mut p = OutputParser::with_style(tools, think, pick & 8 != 0, vec!["<|im_end|>".into()]);
    let mut pieces = Vec::new();
    for chunk in text.split('\u{1}') {
        pieces.extend(p.push(chunk));
    }
    let (rest, calls) = p.finish();
    pieces.extend(rest);
    for c in &calls {
        assert!(
            serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok(),
            "{c:?}"
        );
    }
    let emitted: usize = pieces
        .iter()
        .map(|p| match p {
            Piece::Content(s) | Piece::Reasoning(s) => s.len(),
        })
        .sum();
    assert!(emitted <= text.len());
});
