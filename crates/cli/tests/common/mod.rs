//! Helpers shared by the binary's integration tests.
#![allow(dead_code)]

pub mod faults;
pub mod nginx;

use std::process::Command;

/// Runs the binary with `args`; panics with its stderr unless it succeeds. Returns stdout.
pub fn strata_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("spawn strata");
    assert!(
        out.status.success(),
        "strata {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs the binary with `args`, expecting success and one JSON document on stdout.
pub fn strata_json(args: &[&str]) -> serde_json::Value {
    let stdout = strata_stdout(args);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("strata {args:?}: {e}: {stdout}"))
}
