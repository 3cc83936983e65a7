//! `strata pull` as `hf download` works: every byte by default, shards chosen by glob,
//! `--revision`, and `--local-dir` giving a plain folder that runs as the original does;
//! `strata ls` and `strata rm`; and the refusals that would otherwise surprise (a revision given twice, a local folder of sparse
//! shards).

mod common;

use std::process::{Command, Output};

use common::nginx::Nginx;
use strata_testkit::fixture;

const MODEL: &str = "qwen3-moe-tiny";

fn strata(args: &[&str], endpoint: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HOME", common::hf_home_for(args))
        .output()
        .expect("spawn strata")
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

/// The percentage `strata cache ls` gives the one cached model.
fn percent_present(cache: &str, endpoint: &str) -> f64 {
    let ls = ok(strata(&["cache", "ls", "--cache-dir", cache], endpoint));
    let line = ls
        .lines()
        .find(|l| l.contains("hf--test--m"))
        .unwrap_or_else(|| panic!("{ls}"));
    let open = line.find('(').unwrap();
    line[open + 1..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn pull_fetches_every_byte_by_default_chosen_shards_with_globs_and_a_local_folder() {
    let server = Nginx::start("pull", &[("test/m", &fixture(MODEL))]);
    let e = server.endpoint();
    let cache = server.root.join("cache");
    let c = cache.to_str().unwrap();

    // One shard by glob: part of the model.
    ok(strata(
        &[
            "pull",
            "hf://test/m",
            "--include",
            "*-00001-of-*",
            "--cache-dir",
            c,
        ],
        &e,
    ));
    let part = percent_present(c, &e);
    assert!(part > 0.0 && part < 100.0, "{part}");
    // Excluding every shard is refused.
    let out = strata(
        &[
            "pull",
            "hf://test/m",
            "--exclude",
            "*.safetensors",
            "--cache-dir",
            c,
        ],
        &e,
    );
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("leave none"));

    // By default everything, into a plain folder too: it runs as the original folder does.
    let local = server.root.join("local");
    let l = local.to_str().unwrap();
    ok(strata(
        &[
            "pull",
            "test/m",
            "--revision",
            "main",
            "--local-dir",
            l,
            "--cache-dir",
            c,
        ],
        &e,
    ));
    assert_eq!(percent_present(c, &e), 100.0);
    for f in [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "model-00004-of-00004.safetensors",
    ] {
        assert!(local.join(f).is_file(), "{f}");
    }
    assert!(!std::fs::read_dir(&local).unwrap().any(|f| f
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("strata")));
    let run = |model: &str, extra: &[&str]| {
        let mut a = vec![
            "run",
            model,
            "--ids",
            "1,2,3",
            "-n",
            "4",
            "--temp",
            "0",
            "--output",
            "json",
            "--cache-dir",
            c,
        ];
        a.extend(extra);
        ok(strata(&a, &e))
    };
    let want = run(fixture(MODEL).to_str().unwrap(), &[]);
    assert_eq!(run(l, &[]), want);
    // Every expert is cached: offline runs need nothing more.
    assert_eq!(run("hf://test/m", &["--offline"]), want);

    // strata ls names it as other commands take it; rm of a revision, then of the model.
    let ls = ok(strata(&["ls", "--cache-dir", c], &e));
    assert!(ls.contains("hf://test/m ") && ls.contains("used "), "{ls}");
    let rm = ok(strata(
        &["rm", "test/m", "--revision", "main", "--cache-dir", c],
        &e,
    ));
    assert!(rm.starts_with("removed hf://test/m "), "{rm}");
    assert!(!ok(strata(&["ls", "--cache-dir", c], &e)).contains("hf://test/m "));
    ok(strata(&["rm", "hf--test--m", "--cache-dir", c], &e));
    let again = strata(&["rm", "hf://test/m", "--cache-dir", c], &e);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("not in the cache"));
    ok(strata(
        &["pull", "hf://test/m", "--experts", "none", "--cache-dir", c],
        &e,
    ));

    // Refusals.
    let twice = strata(
        &["pull", "hf://test/m@main", "--revision", "main", "--cache-dir", c],
        &e,
    );
    assert!(!twice.status.success() && String::from_utf8_lossy(&twice.stderr).contains("revision once"));
    let sparse = strata(
        &[
            "pull",
            "hf://test/m",
            "--experts",
            "none",
            "--local-dir",
            l,
            "--cache-dir",
            c,
        ],
        &e,
    );
    assert!(!sparse.status.success() && String::from_utf8_lossy(&sparse.stderr).contains("--experts none"));
}
