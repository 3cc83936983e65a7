//! Flags people bring from llama.cpp and ollama, and their aliases, mean what they say: sizes
//! with or without "i" and "B" are the same binary size, `-c` is `--ctx-size`, `--temp` is
//! `--temperature`, and `serve --host localhost` listens where clients of `localhost` connect.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::strata_stdout as out;
use strata_testkit::fixture;

#[test]
fn sizes_and_short_flags_are_their_long_forms() {
    let m = fixture("qwen3-moe-tiny");
    let dir = m.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let mut a = vec!["inspect", dir, "--json"];
        a.extend(extra);
        out(&a)
    };
    let want = plan(&["--mem", "64M"]);
    for same in ["64MiB", "64MB", "64m", "65536K"] {
        assert_eq!(plan(&["--mem", same]), want, "--mem {same}");
    }
    assert_ne!(plan(&["--mem", "80M"]), want, "the plan depends on --mem");
    assert_eq!(
        plan(&["--mem", "64M", "-c", "32"]),
        plan(&["--mem", "64M", "--ctx-size", "32"])
    );

    let run = |flag: &str| {
        out(&[
            "run", dir, "--ids", "1,2,3", "-n", "6", flag, "1.3", "--seed", "7", "--output", "json",
        ])
    };
    assert_eq!(run("--temp"), run("--temperature"));
}

#[test]
fn serve_host_localhost_is_reached_as_localhost() {
    let m = fixture("qwen3-moe-tiny");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "serve",
            m.to_str().unwrap(),
            "--host",
            "localhost",
            "--port",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let reply = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("localhost", port)) {
            s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut r = String::new();
            let _ = s.read_to_string(&mut r);
            break r;
        }
        assert!(Instant::now() < deadline, "serve --host localhost never listened");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}
