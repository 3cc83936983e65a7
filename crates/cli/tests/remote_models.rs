//! Models served over HTTP by a real nginx on loopback, laid out as the Hugging Face hub does
//! (`/{repo}/resolve/{revision}/`, `X-Repo-Commit`), run through `hf://` with `HF_ENDPOINT`
//! pointing at it: every fixture gives exactly the logits and generations of its local folder;
//! cached runs make no range request; with the server stopped, `--offline` gives them again.

mod common;

use std::process::Command;

use common::nginx::{Nginx, COMMIT};
use serde_json::Value;
use strata_testkit::{as_u32s, fixture, golden, BF16_MODELS, QUANTIZED_MODELS};

fn strata(args: &[&str], endpoint: &str, extra_env: &[(&str, &str)]) -> (bool, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HOME", common::hf_home_for(args))
        .env("STRATA_HTTP_BACKOFF_MS", "20");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn strata");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.success(), json, stderr)
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

const KIMI: &[&str] = &["kimi-k3-tiny"];

/// No byte of a file was asked for twice: every range request was for a run not yet present.
fn assert_one_request_per_missing_run(server: &Nginx, name: &str) {
    let log = std::fs::read_to_string(server.root.join("access.log")).unwrap();
    let mut by_file: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
    for line in log
        .lines()
        .filter(|l| l.starts_with("206 ") && l.contains(&format!("/test/{name}/")))
    {
        let (uri, rest) = line[4..].split_once(" range=bytes=").expect("ranged log line");
        let range = rest.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        by_file
            .entry(uri.to_string())
            .or_default()
            .push((a.parse().unwrap(), b.parse().unwrap()));
    }
    for (uri, mut ranges) in by_file {
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(
                w[0].1 < w[1].0,
                "{uri}: bytes {:?} and {:?} were both requested",
                w[0],
                w[1]
            );
        }
    }
}

#[test]
fn every_fixture_through_hf_matches_its_local_folder_then_offline() {
    let names: Vec<&str> = BF16_MODELS
        .iter()
        .chain(QUANTIZED_MODELS)
        .chain(KIMI)
        .copied()
        .collect();
    let repos: Vec<(String, std::path::PathBuf)> =
        names.iter().map(|n| (format!("test/{n}"), fixture(n))).collect();
    let repo_refs: Vec<(&str, &std::path::Path)> =
        repos.iter().map(|(r, d)| (r.as_str(), d.as_path())).collect();
    let mut server = Nginx::start("hf", &repo_refs);
    let cache = server.root.join("cache");
    let cache = cache.to_str().unwrap().to_string();
    let endpoint = server.endpoint();

    // (name, logits args, run args) per fixture, and their local outputs.
    let mut cases = Vec::new();
    for name in &names {
        let g = golden(name);
        let prompts = g["prompts"].as_array().unwrap();
        let ids = csv(&as_u32s(&prompts[prompts.len() - 1]["ids"]));
        let local = fixture(name).to_str().unwrap().to_string();
        let hf = format!("hf://test/{name}");
        let logits = |model: &str| {
            vec![
                "logits".to_string(),
                "--model".into(),
                model.into(),
                "--ids".into(),
                ids.clone(),
            ]
        };
        let run = |model: &str| {
            let mut a: Vec<String> = [
                "run",
                "--model",
                model,
                "--ids",
                &ids,
                "--max-tokens",
                "6",
                "--temperature",
                "0",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            a.extend(["--ignore-eos", "--output", "json"].iter().map(|s| s.to_string()));
            a
        };
        let as_refs = |v: &Vec<String>| v.clone();
        let (ok, want_logits, err) = strata(
            &as_refs(&logits(&local))
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} local: {err}");
        let (ok, want_run, err) = strata(
            &run(&local).iter().map(String::as_str).collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} local run: {err}");
        cases.push((name.to_string(), logits(&hf), run(&hf), want_logits, want_run));
    }

    let with_cache = |args: &Vec<String>, extra: &[&str]| -> Vec<String> {
        let mut a = args.clone();
        a.extend(["--cache-dir".to_string(), cache.clone()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    for (name, logits, run, want_logits, want_run) in &cases {
        let before = server.requests("206 ");
        let (ok, got, err) = strata(
            &with_cache(logits, &[])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} via hf://: {err}");
        assert_eq!(
            &got, want_logits,
            "{name}: logits via hf:// differ from the local folder"
        );
        let fetched = server.requests("206 ") - before;
        assert!(fetched > 0, "{name}: no range request was made");
        assert_one_request_per_missing_run(&server, name);
        // Everything needed is cached now: the same run again makes no range request.
        let before = server.requests("206 ");
        let (ok, got, err) = strata(
            &with_cache(logits, &[])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} cached: {err}");
        assert_eq!(&got, want_logits);
        assert_eq!(
            server.requests("206 "),
            before,
            "{name}: a fully cached run fetched again"
        );
        // Generation (reads whatever experts the new tokens route to).
        let (ok, got, err) = strata(
            &with_cache(run, &[])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} run via hf://: {err}");
        assert_eq!(
            got["token_ids"], want_run["token_ids"],
            "{name}: generation via hf://"
        );
    }
    // The cache is pinned to the commit the branch resolved to.
    assert!(std::path::Path::new(&cache)
        .join("models/hf--test--kimi-k3-tiny/snapshots")
        .join(COMMIT)
        .is_dir());

    server.stop();
    for (name, logits, run, want_logits, want_run) in &cases {
        let (ok, got, err) = strata(
            &with_cache(logits, &["--offline"])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[],
        );
        assert!(ok, "{name} --offline: {err}");
        assert_eq!(&got, want_logits, "{name}: offline logits");
        let (ok, got, err) = strata(
            &with_cache(run, &[])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &endpoint,
            &[("HF_HUB_OFFLINE", "1")],
        );
        assert!(ok, "{name} HF_HUB_OFFLINE=1: {err}");
        assert_eq!(got["token_ids"], want_run["token_ids"]);
    }
    // Offline, a model never fetched is a clear error, and no request is attempted.
    let (ok, _, err) = strata(
        &[
            "logits",
            "--model",
            "hf://test/never-seen",
            "--ids",
            "1",
            "--cache-dir",
            &cache,
            "--offline",
        ],
        &endpoint,
        &[],
    );
    assert!(!ok && err.contains("offline"), "{err}");
    server.resume();
}

/// A complete file already in the Hugging Face cache (`HF_HUB_CACHE` layout, same commit) is
/// used read-only: no range request for its shards.
#[test]
fn files_in_the_hugging_face_cache_are_reused() {
    let name = "qwen3-moe-tiny";
    let server = Nginx::start("hfcache", &[("test/reuse", &fixture(name))]);
    let hub = server.root.join("hub");
    let snap = hub.join("models--test--reuse/snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().ends_with(".safetensors")
            && !e.file_name().to_string_lossy().starts_with("golden")
        {
            std::fs::copy(e.path(), snap.join(e.file_name())).unwrap();
        }
    }
    // (name, bytes, modification time): a write of the same bytes shows in the time.
    type Seen = (std::ffi::OsString, Vec<u8>, std::time::SystemTime);
    let hub_bytes = || -> Vec<Seen> {
        let mut v: Vec<_> = std::fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                let modified = e.metadata().unwrap().modified().unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap(), modified)
            })
            .collect();
        v.sort();
        v
    };
    let before = hub_bytes();
    let g = golden(name);
    let ids = csv(&as_u32s(&g["prompts"][0]["ids"]));
    let local = fixture(name);
    let (ok, want, err) = strata(
        &["logits", "--model", local.to_str().unwrap(), "--ids", &ids],
        "http://unused",
        &[],
    );
    assert!(ok, "{err}");
    let cache = server.root.join("cache");
    let (ok, got, err) = strata(
        &[
            "logits",
            "--model",
            "hf://test/reuse",
            "--ids",
            &ids,
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &server.endpoint(),
        &[("HF_HUB_CACHE", hub.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert_eq!(got, want);
    assert_eq!(
        server.requests("206 "),
        0,
        "shards in the HF cache were fetched anyway"
    );
    // Without that Hugging Face cache (another HF_HUB_CACHE), the mirror's links into it are
    // replaced by files of its own: fetched by range, never written through the links.
    let (ok, got, err) = strata(
        &[
            "logits",
            "--model",
            "hf://test/reuse",
            "--ids",
            &ids,
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &server.endpoint(),
        &[("HF_HUB_CACHE", server.root.join("no-hub").to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert_eq!(got, want);
    assert!(server.requests("206 ") > 0);
    assert!(
        hub_bytes() == before,
        "bytes were written into the Hugging Face cache"
    );
}

/// The hub redirects every file to a CDN on another host: the token goes to the hub only, and a
/// file's redirect is remembered (one hub request per file, not per range).
#[test]
fn redirects_are_followed_remembered_and_never_carry_the_token() {
    let name = "mixtral-tiny";
    let cdn = Nginx::start("cdn", &[("test/r", &fixture(name))]);
    // Same server, another host name: "localhost" is not the endpoint's "127.0.0.1".
    let hub = common::faults::Redirector::start(format!("http://localhost:{}", cdn.port));
    let g = golden(name);
    let ids = csv(&as_u32s(&g["prompts"][0]["ids"]));
    let (ok, want, err) = strata(
        &[
            "logits",
            "--model",
            fixture(name).to_str().unwrap(),
            "--ids",
            &ids,
        ],
        "http://unused",
        &[],
    );
    assert!(ok, "{err}");
    let cache = cdn.root.join("cache");
    let (ok, got, err) = strata(
        &[
            "logits",
            "--model",
            "hf://test/r",
            "--ids",
            &ids,
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &format!("http://127.0.0.1:{}", hub.port),
        &[("HF_TOKEN", "hf_secret_token")],
    );
    assert!(ok, "{err}");
    assert_eq!(got, want);
    assert!(!err.contains("hf_secret_token"), "the token was logged: {err}");
    let seen = hub.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|(_, auth)| auth.as_deref() == Some("Bearer hf_secret_token")),
        "the hub must get the token: {seen:?}"
    );
    let log = std::fs::read_to_string(cdn.root.join("access.log")).unwrap();
    assert!(log.lines().count() > 0);
    assert!(
        log.lines().all(|l| l.ends_with("auth=-")),
        "the token reached the CDN:\n{log}"
    );
    // One hub request per file: its redirect is reused for every later range of that file.
    let mut paths: Vec<&String> = seen.iter().map(|(p, _)| p).collect();
    let n = paths.len();
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths.len(),
        n,
        "a file's redirect was asked for more than once: {seen:?}"
    );
    assert!(
        cdn.requests("206 ") > paths.len(),
        "expected several ranges per file"
    );
}
