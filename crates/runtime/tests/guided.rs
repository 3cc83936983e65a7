//! Structured output in the engine: a guided sequence's text matches its JSON schema on
//! random-weight models (a `tokenizer.json` vocabulary and a tiktoken one), an unguided sequence
//! beside it gets exactly its solo output, and a schema the compiler refuses is an error.

use strata_runtime::{
    Batch, Engine, FinishReason, GenEvent, Guide, LoadOptions, Request, RequestExtras, SamplingParams,
};
use strata_testkit::fixture;

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["a", "b"]}
        },
        "required": ["n", "tag"],
        "additionalProperties": false
    })
}

fn request(prompt: Vec<u32>, seed: u64) -> Request {
    Request {
        prompt,
        max_new_tokens: 40,
        sampling: SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        },
        stop: vec![],
        ignore_eos: false,
    }
}

/// (text, finish) of each sequence run together.
fn run(engine: &Engine, seqs: Vec<(Request, RequestExtras)>) -> Vec<(String, Option<FinishReason>)> {
    let mut out = vec![(String::new(), None); seqs.len()];
    let mut batch = Batch::new(engine);
    for (i, (r, e)) in seqs.into_iter().enumerate() {
        batch.add(i as u64, r, e).unwrap();
    }
    while !batch.is_empty() {
        batch
            .step(&mut |i, e| {
                match e {
                    GenEvent::Token { text, .. } => out[i as usize].0.push_str(text),
                    GenEvent::Done { reason } => out[i as usize].1 = Some(reason),
                    GenEvent::Failed { error } => panic!("{error}"),
                }
                true
            })
            .unwrap();
    }
    out
}

#[test]
fn guided_output_matches_its_schema_and_leaves_its_neighbours_alone() {
    for name in ["qwen3-moe-tiny", "kimi-k3-tiny"] {
        let engine = Engine::load(&fixture(name), &LoadOptions::default()).unwrap();
        let prompt = vec![3, 4, 5, 6];
        let guided = RequestExtras {
            guide: Some(Guide::JsonSchema(schema())),
            ..Default::default()
        };
        let alone = run(
            &engine,
            vec![(request(prompt.clone(), 5), RequestExtras::default())],
        );
        for seed in 0..3 {
            let both = run(
                &engine,
                vec![
                    (request(prompt.clone(), seed), guided.clone()),
                    (request(prompt.clone(), 5), RequestExtras::default()),
                ],
            );
            let (text, finish) = &both[0];
            assert_eq!(*finish, Some(FinishReason::Stop), "{name}: {text}");
            let doc: serde_json::Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {text}: {e}"));
            let n = doc["n"].as_i64().unwrap();
            assert!(
                (0..=99).contains(&n) && ["a", "b"].contains(&doc["tag"].as_str().unwrap()),
                "{name}: {doc}"
            );
            assert_eq!(doc.as_object().unwrap().len(), 2, "{name}: {doc}");
            assert_eq!(both[1], alone[0], "{name}: the unguided neighbour");
        }
        let bad = RequestExtras {
            guide: Some(Guide::JsonSchema(serde_json::json!({"type": "nonsense"}))),
            ..Default::default()
        };
        let err = Batch::new(&engine).add(0, request(prompt, 1), bad).unwrap_err();
        assert!(err.to_string().contains("structured output"), "{name}: {err}");
    }
}
