//! The reference checks driven through the real `strata` binary, as external checks use it:
//! `strata logits`, `strata run --output json`, `strata tokenize`, `strata detokenize`.

use serde_json::Value;
use strata_testkit::{
    as_f32s, as_u32s, check_last_logits, checked_generation_len, fixture, golden, rel_tolerance, BF16_MODELS,
    QUANTIZED_MODELS,
};

mod common;

fn strata(args: &[&str]) -> Value {
    common::strata_json(args)
}

/// `strata run` greedy on one of a golden's generation entries, with `extra` flags; the JSON
/// output.
fn greedy_run(dir: &str, entry: &Value, extra: &[&str]) -> Value {
    let args = common::greedy_args(dir, entry);
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    strata(&args)
}

use common::csv;

#[test]
fn logits_and_run_through_the_binary_match_goldens() {
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        common::check_goldens(name, &strata);
    }
}

#[test]
fn tokenize_and_detokenize_through_the_binary_match_goldens() {
    for name in BF16_MODELS {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        for case in g["tokenizer"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let out = strata(&["tokenize", "--model", dir, "--text", text]);
            assert_eq!(
                as_u32s(&out["ids"]),
                as_u32s(&case["ids"]),
                "{name}: tokenize {text:?}"
            );
            let out = strata(&["tokenize", "--model", dir, "--text", text, "--add-special"]);
            assert_eq!(
                as_u32s(&out["ids"]),
                as_u32s(&case["ids_add_special_tokens"]),
                "{name}: {text:?} +special"
            );
            let ids = csv(&as_u32s(&case["ids"]));
            if !ids.is_empty() {
                let out = strata(&["detokenize", "--model", dir, "--ids", &ids]);
                assert_eq!(out["text"], case["decoded"], "{name}: detokenize {text:?}");
                let out = strata(&["detokenize", "--model", dir, "--ids", &ids, "--skip-special"]);
                assert_eq!(
                    out["text"], case["decoded_skip_special"],
                    "{name}: detokenize --skip-special {text:?}"
                );
            }
        }
        let tmp = std::env::temp_dir().join(format!("strata-chat-{}-{name}.json", std::process::id()));
        for case in g["chat_template"].as_array().unwrap() {
            std::fs::write(&tmp, serde_json::to_string(&case["messages"]).unwrap()).unwrap();
            let mut args = vec!["tokenize", "--model", dir, "--chat", tmp.to_str().unwrap()];
            if case["add_generation_prompt"].as_bool().unwrap() {
                args.push("--add-generation-prompt");
            }
            let kwargs = serde_json::to_string(&case["extra_template_kwargs"]).unwrap();
            args.extend(["--template-kwargs", &kwargs]);
            let out = strata(&args);
            assert_eq!(out["text"], case["rendered"], "{name}: chat rendering");
            assert_eq!(as_u32s(&out["ids"]), as_u32s(&case["ids"]), "{name}: chat ids");
        }
        let _ = std::fs::remove_file(&tmp);
    }
}

#[test]
fn tokenizer_commands_work_on_a_folder_with_only_tokenizer_files() {
    let dir = fixture("tokenizers/qwen3");
    let dir = dir.to_str().unwrap();
    let out = strata(&["tokenize", "--model", dir, "--text", "Hello world"]);
    let ids = as_u32s(&out["ids"]);
    assert!(!ids.is_empty());
    let out = strata(&["detokenize", "--model", dir, "--ids", &csv(&ids)]);
    assert_eq!(out["text"], "Hello world");
}

#[test]
fn a_cache_smaller_than_one_expert_changes_nothing_through_the_binary() {
    // `--expert-cache 1K` holds no expert: every routed expert is read from disk at every use.
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        let rel = rel_tolerance(&g);
        for prompt in g["prompts"].as_array().unwrap() {
            let ids = csv(&as_u32s(&prompt["ids"]));
            let streamed = strata(&["logits", "--model", dir, "--ids", &ids, "--expert-cache", "1K"]);
            let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
            assert_eq!(streamed, cached, "{name}: streaming changed the logits");
            let through = |io: &str| {
                strata(&[
                    "logits",
                    "--model",
                    dir,
                    "--ids",
                    &ids,
                    "--expert-cache",
                    "1K",
                    "--io",
                    io,
                ])
            };
            assert_eq!(through("mmap"), cached, "{name}: --io mmap changed the logits");
            if strata_experts::uring_available() {
                assert_eq!(through("uring"), cached, "{name}: --io uring changed the logits");
            } else {
                eprintln!("io_uring is not available to this process: --io uring not checked");
            }
            let absmax = prompt["last_logits_absmax"].as_f64().unwrap() as f32;
            check_last_logits(
                &as_f32s(&streamed["last_logits"]),
                &as_f32s(&prompt["last_logits"]),
                absmax,
                rel,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let entry = &g["generation"][0];
        let want = as_u32s(&entry["new_ids"]);
        let out = greedy_run(dir, &g["generation"][0], &["--expert-cache", "1K"]);
        let p = entry["prompt_index"].as_u64().unwrap() as usize;
        let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
        let margins = as_f32s(&entry["step_top2_margin"]);
        let checked = checked_generation_len(&margins, rel, absmax);
        assert_eq!(
            &as_u32s(&out["token_ids"])[..checked],
            &want[..checked],
            "{name}: streamed generation"
        );
    }
}

#[test]
fn streamed_layers_change_nothing_through_the_binary() {
    // `--spine stream`: every decoder layer's non-expert weights are read from disk each time
    // the layer runs (and `--expert-cache 1K` reads every expert too).
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        let prompt = &g["prompts"][0];
        let ids = csv(&as_u32s(&prompt["ids"]));
        let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
        for io in ["pread", "mmap"] {
            let streamed = strata(&[
                "logits",
                "--model",
                dir,
                "--ids",
                &ids,
                "--expert-cache",
                "1K",
                "--spine",
                "stream",
                "--io",
                io,
            ]);
            assert_eq!(
                streamed, cached,
                "{name}: streamed layers (--io {io}) changed the logits"
            );
        }
        let run =
            |spine: &str| greedy_run(dir, &g["generation"][0], &["--spine", spine])["token_ids"].clone();
        assert_eq!(run("stream"), run("resident"), "{name}: streamed generation");
    }
}

/// The model as the first argument is `--model`; a bare `ORG/NAME` that is no local path is a
/// Hugging Face model (offline and not cached: an error naming `hf://ORG/NAME`).
#[test]
fn the_model_as_first_argument_and_org_name_as_a_hub_model() {
    let name = BF16_MODELS[0];
    let dir = fixture(name);
    let dir = dir.to_str().unwrap();
    let entry = &golden(name)["generation"][0];
    let flagged = greedy_run(dir, entry, &[]);
    let mut args = common::greedy_args(dir, entry);
    args.retain(|a| a != "--model"); // ["run", dir, ...]
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(&args[..2], ["run", dir]);
    assert_eq!(strata(&args), flagged, "{name}: MODEL as the first argument");

    let cache = std::env::temp_dir().join(format!("strata-org-name-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "run",
            "no-such-org/no-such-model",
            "--offline",
            "--ids",
            "1",
            "--cache-dir",
        ])
        .arg(&cache)
        .output()
        .expect("spawn strata");
    let _ = std::fs::remove_dir_all(&cache);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("taking it as hf://no-such-org/no-such-model"),
        "{err}"
    );
}

/// `--file FILE` and `--prompt -` (standard input) give the prompt `--prompt TEXT` gives, one
/// final newline dropped.
#[test]
fn the_prompt_from_a_file_or_standard_input() {
    let dir = fixture(BF16_MODELS[0]);
    let dir = dir.to_str().unwrap();
    let text = "Hello there, tiny model";
    let common = [
        "--temperature",
        "0",
        "--max-tokens",
        "3",
        "--output",
        "json",
        "--ignore-eos",
    ];
    let run = |extra: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["run", dir])
            .args(common)
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn strata");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{extra:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let want = run(&["--prompt", text], None);
    let file = std::env::temp_dir().join(format!("strata-prompt-{}.txt", std::process::id()));
    std::fs::write(&file, format!("{text}\n")).unwrap();
    let from_file = run(&["-f", file.to_str().unwrap()], None);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(from_file, want, "--file");
    assert_eq!(
        run(&["--prompt", "-"], Some(&format!("{text}\n"))),
        want,
        "--prompt -"
    );
    assert_eq!(run(&["--file", "-"], Some(text)), want, "--file -");
}

/// The embedded model says what it is whenever it is used.
#[test]
fn the_embedded_model_says_it_is_the_demo() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "--prompt", "Hello", "--max-tokens", "2"])
        .output()
        .expect("spawn strata");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the embedded demo model (20M parameters"),
        "{stderr}"
    );
}
