//! Remote models behind a fault-injecting proxy (in front of a real nginx): strata retries
//! 500s, 429s with Retry-After, truncated bodies, wrong Content-Range, 200-instead-of-206 and
//! stalls and still gives the local folder's exact logits; persistent faults end with a clear
//! error and leave nothing bad in the cache; `strata pull` killed with SIGKILL at random moments
//! leaves a cache that verifies and gives the same logits; a served file that differs from what
//! its header and `X-Linked-Etag` promised is caught; hostile responses (a body longer than its
//! range, a header length of `FF` x 8), a file changed on the server at the same size, and a
//! cache on a full disk end with clear errors and a cache that verifies.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::faults::{FaultProxy, Schedule, ALL_FAULTS};
use common::nginx::Nginx;
use strata_testkit::{as_u32s, fixture, golden};

const MODEL: &str = "deepseek-v3-tiny";

fn strata(args: &[&str], endpoint: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HOME", common::hf_home_for(args))
        .env("STRATA_HTTP_BACKOFF_MS", "20")
        .env("STRATA_HTTP_TIMEOUT_S", "2");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spawn strata")
}

fn ids() -> String {
    let g = golden(MODEL);
    let p = g["prompts"].as_array().unwrap();
    as_u32s(&p[p.len() - 1]["ids"])
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn local_logits() -> String {
    let out = strata(
        &[
            "logits",
            "--model",
            fixture(MODEL).to_str().unwrap(),
            "--ids",
            &ids(),
        ],
        "http://unused",
        &[],
    );
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn logits_via(endpoint: &str, cache: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let ids = ids();
    let mut args = vec![
        "logits",
        "--model",
        "hf://test/m",
        "--ids",
        &ids,
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend(extra);
    strata(&args, endpoint, env)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_fault_is_retried_and_the_logits_match() {
    let server = Nginx::start("faults", &[("test/m", &fixture(MODEL))]);
    let proxy = FaultProxy::start(server.port, Schedule::Alternate(ALL_FAULTS.to_vec()), None);
    let cache = server.root.join("cache");
    let out = logits_via(&proxy.endpoint(), &cache, &[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), local_logits());
    let sent = proxy.faults_sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent >= ALL_FAULTS.len(), "only {sent} faults were injected");
    // Nothing bad was recorded.
    verify(&cache);
}

#[test]
fn persistent_faults_fail_clearly_and_cache_nothing_bad() {
    let server = Nginx::start("persist", &[("test/m", &fixture(MODEL))]);
    let cache = server.root.join("cache");
    for fault in ALL_FAULTS {
        if fault == common::faults::Fault::Stall {
            continue; // as ServerError, only slower
        }
        let proxy = FaultProxy::start(server.port, Schedule::Always(fault), None);
        let out = logits_via(&proxy.endpoint(), &cache, &[], &[("STRATA_HTTP_ATTEMPTS", "3")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{fault:?}: {err}");
        assert!(
            err.contains("/test/m/resolve/")
                && err.contains("bytes ")
                && err.contains("gave up after 3 attempts"),
            "{fault:?}: the error should name the URL and range: {err}"
        );
    }
    // The same cache, now through a healthy server: exact logits, and it verifies.
    let out = logits_via(&server.endpoint(), &cache, &[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), local_logits());
    let v = strata(
        &["cache", "verify", "--cache-dir", cache.to_str().unwrap()],
        "http://unused",
        &[],
    );
    assert!(v.status.success());
}

#[test]
fn pull_killed_at_random_moments_leaves_a_cache_that_verifies() {
    let server = Nginx::start("kill", &[("test/m", &fixture(MODEL))]);
    let proxy = FaultProxy::start(server.port, Schedule::Never, None);
    *proxy.delay.lock().unwrap() = Duration::from_millis(40);
    let cache = server.root.join("cache");
    let cache_s = cache.to_str().unwrap().to_string();
    let mut seed = 0x2545_F491u64;
    for round in 0..6 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(30 + seed % 400);
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["pull", "hf://test/m", "--experts", "all", "--cache-dir", &cache_s])
            .env("HF_ENDPOINT", proxy.endpoint())
            .env("HF_HOME", common::hf_home_for(&["--cache-dir", &cache_s]))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while start.elapsed() < wait {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let v = strata(
            &["cache", "verify", "--cache-dir", &cache_s],
            "http://unused",
            &[],
        );
        assert!(
            v.status.success(),
            "round {round}: {}{}",
            String::from_utf8_lossy(&v.stdout),
            stderr(&v)
        );
    }
    *proxy.delay.lock().unwrap() = Duration::ZERO;
    let out = strata(
        &["pull", "hf://test/m", "--experts", "all", "--cache-dir", &cache_s],
        &proxy.endpoint(),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let ls = strata(&["cache", "ls", "--cache-dir", &cache_s], "http://unused", &[]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("(100 %)"),
        "{}",
        String::from_utf8_lossy(&ls.stdout)
    );
    let out = logits_via("http://127.0.0.1:9", &cache, &["--offline"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), local_logits());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_served_file_that_differs_from_its_promise_is_caught() {
    // Wrong sha256 in X-Linked-Etag: a full pull checks every shard against it.
    let server = Nginx::start("etag", &[("test/m", &fixture(MODEL))]);
    let proxy = FaultProxy::start(server.port, Schedule::Never, Some("0".repeat(64)));
    let cache = server.root.join("cache");
    let out = strata(
        &[
            "pull",
            "hf://test/m",
            "--experts",
            "all",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &proxy.endpoint(),
        &[],
    );
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("sha256"), "{err}");

    // A shard replaced on the server by one of another size after its header was cached.
    let copy: PathBuf = std::env::temp_dir().join(format!("strata-changed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&fixture(MODEL), &copy);
    let server = Nginx::start("changed", &[("test/m", &copy)]);
    let cache = server.root.join("cache");
    let c = cache.to_str().unwrap();
    let out = strata(
        &["pull", "hf://test/m", "--experts", "none", "--cache-dir", c],
        &server.endpoint(),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shard = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".safetensors") && !p.to_string_lossy().contains("golden"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&shard, bytes).unwrap();
    let out = strata(
        &["pull", "hf://test/m", "--experts", "all", "--cache-dir", c],
        &server.endpoint(),
        &[],
    );
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("changed on the server"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&copy);
}

fn verify(cache: &Path) {
    let v = strata(
        &["cache", "verify", "--cache-dir", cache.to_str().unwrap()],
        "http://unused",
        &[],
    );
    assert!(
        v.status.success(),
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        stderr(&v)
    );
}

#[test]
fn hostile_responses_fail_clearly_and_the_cache_verifies() {
    use common::faults::Fault;
    let server = Nginx::start("hostile", &[("test/m", &fixture(MODEL))]);
    let cache = server.root.join("cache");
    for (fault, says) in [
        (Fault::LongBody, "longer than"),
        (Fault::HugeHeaderLength, "header length 18446744073709551615"),
    ] {
        let proxy = FaultProxy::start(server.port, Schedule::Always(fault), None);
        let out = logits_via(&proxy.endpoint(), &cache, &[], &[("STRATA_HTTP_ATTEMPTS", "2")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{fault:?}: {err}");
        assert!(
            err.contains(says) && err.contains("/test/m/resolve/"),
            "{fault:?}: {err}"
        );
        verify(&cache);
    }
    let out = logits_via(&server.endpoint(), &cache, &[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), local_logits());
    verify(&cache);
}

#[test]
fn a_file_changed_on_the_server_at_the_same_size_is_caught() {
    let copy: PathBuf = std::env::temp_dir().join(format!("strata-same-size-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&fixture(MODEL), &copy);
    let server = Nginx::start("same-size", &[("test/m", &copy)]);
    let cache = server.root.join("cache");
    let c = cache.to_str().unwrap();
    // Headers and resident weights cached; experts not yet.
    let out = strata(
        &["pull", "hf://test/m", "--experts", "none", "--cache-dir", c],
        &server.endpoint(),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Every shard rewritten with other bytes in its last KiB, at the same size and a new time.
    for e in std::fs::read_dir(&copy).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("model-") || !name.ends_with(".safetensors") {
            continue;
        }
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 1024..].iter_mut().for_each(|b| *b ^= 0x55);
        std::fs::write(&p, &bytes).unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(120);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(later)
            .unwrap();
    }
    let out = strata(
        &["pull", "hf://test/m", "--experts", "all", "--cache-dir", c],
        &server.endpoint(),
        &[],
    );
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("changed on the server"),
        "{err}"
    );
    verify(&cache);
    let _ = std::fs::remove_dir_all(&copy);
}

#[test]
fn a_full_cache_disk_is_a_clear_error_and_trusts_nothing_wrong() {
    // The cache on a 1 MiB tmpfs (in a private mount namespace) cannot hold the model's 4 MB.
    let server = Nginx::start("full", &[("test/m", &fixture(MODEL))]);
    let cache = server.root.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let bin = env!("CARGO_BIN_EXE_strata");
    let c = cache.to_str().unwrap();
    let script = format!(
        "mount -t tmpfs -o size=1m tmpfs {c} || exit 97; \
         {bin} pull hf://test/m --experts all --cache-dir {c}; echo \"pull-rc=$?\" >&2; \
         {bin} cache verify --cache-dir {c} >&2; echo \"verify-rc=$?\" >&2"
    );
    let out = Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .env("HF_ENDPOINT", server.endpoint())
        .env("HF_HOME", common::hf_home_for(&["--cache-dir", c]))
        .env("STRATA_HTTP_BACKOFF_MS", "20")
        .output()
        .expect("unshare (util-linux)");
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(97), "could not mount a tmpfs: {err}");
    assert!(err.contains("disk is full"), "{err}");
    assert!(!err.contains("pull-rc=0"), "{err}");
    assert!(err.contains("verify-rc=0"), "{err}");
}
