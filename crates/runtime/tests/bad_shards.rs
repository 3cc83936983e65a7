//! A shard that shrinks while the engine runs (the expert store and streamed layers read it
//! lazily) gives a clear error naming the file, not a panic or wrong output.

use strata_runtime::{Engine, LoadOptions, ModelPlan, SpineMode};
use strata_testkit::{as_u32s, golden, ScratchCopy};

#[test]
fn a_shard_truncated_mid_run_is_a_clear_error() {
    for (io, tag) in [
        (strata_experts::IoMode::Direct, "shrink"),
        (strata_experts::IoMode::Uring, "shrink-uring"),
    ] {
        if io == strata_experts::IoMode::Uring && !strata_experts::uring_available() {
            eprintln!("io_uring is not available to this process: only --io pread checked");
            continue;
        }
        // No expert fits in the cache: every routed expert is read at use.
        truncated_mid_run("qwen3-moe-tiny", io, tag, Some(1), SpineMode::Auto);
    }
    // Every expert stays cached after the first pass; the layers' weights are read again (a
    // model with more layers than are read ahead).
    truncated_mid_run(
        "kimi-linear-tiny",
        strata_experts::IoMode::Direct,
        "shrink-spine",
        None,
        SpineMode::Stream,
    );
}

fn truncated_mid_run(
    model: &str,
    io: strata_experts::IoMode,
    tag: &str,
    expert_cache: Option<usize>,
    spine: SpineMode,
) {
    let scratch = ScratchCopy::new(model, tag);
    let plan = ModelPlan::from_dir(&scratch.0).unwrap();
    let engine = Engine::load(
        &scratch.0,
        &LoadOptions {
            expert_cache,
            io,
            spine,
            ..Default::default()
        },
    )
    .unwrap();
    let ids = as_u32s(&golden(model)["prompts"][1]["ids"]);
    engine.logits(&ids).unwrap();

    // Cut every shard that holds experts to its header: the reads that follow run past the end.
    let mut cut = Vec::new();
    for entry in std::fs::read_dir(&scratch.0).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let header = strata_formats::parse_header(&path).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(header.data_start).unwrap();
            cut.push(path.file_name().unwrap().to_string_lossy().to_string());
        }
    }
    assert!(plan.expert_bytes > 0);
    let Err(err) = engine.logits(&ids) else {
        panic!("{model} {io:?} {spine:?}: reading a truncated shard must fail");
    };
    let err = err.to_string();
    assert!(
        cut.iter().any(|name| err.contains(name.as_str())),
        "{io:?}: error names no shard: {err}"
    );
    assert!(err.contains("truncated"), "{io:?}: error does not say why: {err}");
    if spine == SpineMode::Stream {
        assert!(err.contains("streaming its weights"), "{err}");
    }
}
