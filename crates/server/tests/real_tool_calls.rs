//! Each family's tool-call format, as the real tokenizers encode it (Qwen3, DeepSeek-V3 and the
//! Kimi-style tiktoken layout in `fixtures/tokenizers/`), streamed one token at a time through
//! the detokenizer (special tokens kept) and the output parser, as the server does.

use strata_server::parse::{parse_all, OutputParser, ToolFormat};
use strata_testkit::fixture;
use strata_tokenizer::{StreamDecoder, Tokenizer};

fn stream_parse(tok: &Tokenizer, format: ToolFormat, text: &str) -> (String, String, Vec<(String, String)>) {
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > 5, "{text}");
    let mut decoder = StreamDecoder::new(false);
    let mut parser = OutputParser::new(Some(format), false, vec![]);
    let mut deltas: Vec<String> = Vec::new();
    for id in ids {
        deltas.extend(decoder.push(tok, id).unwrap());
    }
    deltas.extend(decoder.flush(tok).unwrap());
    let chunks: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let (content, reasoning, calls) = parse_all(&mut parser, &chunks);
    (
        content,
        reasoning,
        calls.into_iter().map(|c| (c.name, c.arguments)).collect(),
    )
}

#[test]
fn qwen3_hermes_tool_calls_through_the_real_tokenizer() {
    let tok = Tokenizer::from_dir(&fixture("tokenizers/qwen3")).unwrap();
    assert_eq!(ToolFormat::detect(&tok), ToolFormat::Hermes);
    assert!(
        tok.token_to_id("<tool_call>").is_some(),
        "Qwen3 has <tool_call> as one token"
    );
    let text = "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let (content, reasoning, calls) = stream_parse(&tok, ToolFormat::Hermes, text);
    assert_eq!(reasoning.trim(), "The user wants weather.");
    assert_eq!(content.trim(), "Let me check.");
    assert_eq!(
        calls,
        vec![
            ("get_weather".into(), r#"{"city":"Paris","days":3}"#.into()),
            ("get_time".into(), "{}".into())
        ]
    );
}

#[test]
fn deepseek_v3_tool_calls_through_the_real_tokenizer() {
    let tok = Tokenizer::from_dir(&fixture("tokenizers/deepseek-v3")).unwrap();
    assert_eq!(ToolFormat::detect(&tok), ToolFormat::DeepSeek);
    let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, _, calls) = stream_parse(&tok, ToolFormat::DeepSeek, text);
    assert_eq!(content, "");
    assert_eq!(
        calls,
        vec![
            ("get_weather".into(), r#"{"city":"Paris"}"#.into()),
            ("get_time".into(), r#"{"tz":"CET"}"#.into())
        ]
    );
}

#[test]
fn kimi_k2_tool_calls_through_the_kimi_style_tokenizer() {
    let tok = Tokenizer::from_dir(&fixture("tokenizers/tiktoken-kimi-style")).unwrap();
    assert_eq!(ToolFormat::detect(&tok), ToolFormat::Kimi);
    let text = "I will look it up.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
    let (content, _, calls) = stream_parse(&tok, ToolFormat::Kimi, text);
    assert_eq!(content, "I will look it up.");
    assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
}
