//! `strata chat` from a pipe: each turn's answer is what `strata run` gives for the same
//! conversation (greedy), a later turn feeds only what the conversation's cache lacks (its
//! stats line says how many tokens it reused), /save writes what `run --messages` reads, and
//! /reset starts over. (The terminal side, Ctrl-C and line editing, is driven through a
//! pseudo-terminal in `tests/api/test_chat_terminal.py`.)

use std::io::Write;
use std::process::{Command, Stdio};

use strata_testkit::fixture;

/// (stdout, stderr) of `strata ARGS` given `input` on standard input.
fn strata_with_input(args: &[&str], input: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env(
            "XDG_CACHE_HOME",
            std::env::temp_dir().join("strata-chat-test-cache"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "strata {args:?}: {stderr}");
    (stdout, stderr)
}

/// (new, cached) prompt tokens of each turn's stats line.
fn turns(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[strata] prompt "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (
                words[0].parse().unwrap(),
                words[3].trim_start_matches('(').parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn chat_turns_answer_as_run_does_and_feed_only_their_new_tokens() {
    let model = fixture("qwen3-moe-tiny");
    let dir = model.to_str().unwrap();
    let tmp = std::env::temp_dir().join(format!("strata-chat-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let saved = tmp.join("first.json");
    let flags = ["--temp", "0", "-n", "12", "--system", "Be brief."];
    let input = format!(
        "Hello there\n/save {}\nAnd a second \\\nquestion\n/reset\nHello there\n",
        saved.display()
    );
    let mut args = vec!["chat", dir];
    args.extend(flags);
    let (out, err) = strata_with_input(&args, &input);

    // What run gives for the first turn, and for the second from the saved conversation.
    let run = |extra: &[&str]| {
        let mut a = vec!["run", dir, "--chat"];
        a.extend(flags);
        a.extend(extra);
        strata_with_input(&a, "").0
    };
    let first = run(&["-p", "Hello there"]);
    let saved_text = std::fs::read_to_string(&saved).unwrap();
    let messages: serde_json::Value = serde_json::from_str(&saved_text).unwrap();
    assert_eq!(
        messages.as_array().unwrap().len(),
        3,
        "system, user, assistant: {saved_text}"
    );
    assert_eq!(messages[2]["role"], "assistant");
    // The saved conversation has the system message: run takes it from the file.
    let mut a = vec![
        "run",
        dir,
        "--temp",
        "0",
        "-n",
        "12",
        "--chat",
        "-p",
        "And a second \nquestion",
    ];
    a.extend(["--messages", saved.to_str().unwrap()]);
    let second = strata_with_input(&a, "").0;
    assert_eq!(out, format!("{first}{second}{first}"), "stderr: {err}");

    let t = turns(&err);
    assert_eq!(t.len(), 3, "{err}");
    // The first turn feeds its whole prompt; the second reuses at least all of it; after
    // /reset nothing is reused.
    assert_eq!(t[0].1, 0);
    assert!(t[1].1 >= t[0].0, "{t:?}");
    assert!(t[1].0 > 0);
    assert_eq!(t[2], t[0]);
    assert!(err.contains("(conversation cleared)"), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn chat_commands_and_bad_input_get_clear_answers() {
    let model = fixture("qwen3-moe-tiny");
    let dir = model.to_str().unwrap();
    let (out, err) = strata_with_input(
        &["chat", dir, "--temp", "0", "-n", "4"],
        "/help\n/nonsense\n/save\n/bye\nnever read\n",
    );
    assert!(out.is_empty(), "no answer after /bye: {out}");
    assert!(err.contains("/reset"), "{err}");
    assert!(err.contains("unknown command /nonsense"), "{err}");
    assert!(err.contains("/save needs a file name"), "{err}");
    // --messages that is not a conversation names the file.
    let bad = std::env::temp_dir().join(format!("strata-chat-bad-{}.json", std::process::id()));
    std::fs::write(&bad, "{\"role\": \"user\"}").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", dir, "--messages", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains(bad.to_str().unwrap()) && e.contains("array"),
        "{e}"
    );
    std::fs::remove_file(&bad).unwrap();
}
