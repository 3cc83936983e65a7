//! Faults stay with their sequence: a sequence whose forward pass fails, or whose sampling
//! lands where the tokenizer has no token, never changes what the sequences beside it produce;
//! a panic inside the model ends the step with an error and leaves nothing behind.

use strata_runtime::{
    Batch, Engine, EngineError, GenEvent, LoadOptions, Request, RequestExtras, SamplingParams,
};
use strata_testkit::{fixture, golden_prompts};

fn load(name: &str) -> Engine {
    Engine::load(&fixture(name), &LoadOptions::default()).unwrap()
}

fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    Request {
        prompt,
        max_new_tokens: n,
        sampling: SamplingParams::default(),
        stop: vec![],
        ignore_eos: true,
    }
}

/// What each sequence of one batch got: its ids, or its error.
fn run_batch(engine: &Engine, requests: &[Request]) -> Vec<Result<Vec<u32>, String>> {
    let mut batch = Batch::new(engine);
    for (i, r) in requests.iter().enumerate() {
        batch.add(i as u64, r.clone(), RequestExtras::default()).unwrap();
    }
    let mut out: Vec<Result<Vec<u32>, String>> = vec![Ok(Vec::new()); requests.len()];
    while !batch.is_empty() {
        batch
            .step(&mut |i, e| {
                match e {
                    GenEvent::Token { id, .. } => {
                        if let Ok(ids) = &mut out[i as usize] {
                            ids.push(id);
                        }
                    }
                    GenEvent::Failed { error } => out[i as usize] = Err(error.to_string()),
                    GenEvent::Done { .. } => {}
                }
                true
            })
            .unwrap();
    }
    out
}

#[test]
fn a_failing_sequence_leaves_the_others_exactly_as_alone() {
    // One hybrid model (recurrent state restored after the failed pass) and one pure
    // attention model (KV rows rewound).
    for name in ["kimi-linear-tiny", "qwen3-moe-tiny"] {
        let mut engine = load(name);
        let prompts = golden_prompts(name);
        let requests: Vec<Request> = prompts.iter().map(|p| greedy(p.clone(), 6)).collect();
        let alone: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| {
                engine
                    .generate(std::slice::from_ref(r), |_, _| {})
                    .unwrap()
                    .remove(0)
            })
            .collect();
        // The second sequence's prompt holds a token no other prompt holds: a pass over it fails.
        let marker = *prompts[1]
            .iter()
            .find(|t| prompts.iter().enumerate().all(|(i, p)| i == 1 || !p.contains(t)))
            .expect("a token only prompt 1 has");
        engine.faults.fail_on_token = Some(marker);
        let together = run_batch(&engine, &requests);
        for (i, got) in together.iter().enumerate() {
            if i == 1 {
                let e = got.as_ref().unwrap_err();
                assert!(e.contains("injected failure"), "{name}: {e}");
            } else {
                assert_eq!(
                    got.as_ref().unwrap(),
                    &alone[i],
                    "{name}: sequence {i} beside a failing one"
                );
            }
        }
    }
}

#[test]
fn ids_the_tokenizer_cannot_decode_are_never_sampled() {
    let engine = load("qwen3-moe-tiny");
    let tok = engine.tokenizer.as_ref().unwrap();
    let vocab = engine.model.info().vocab_size as u32;
    assert!(
        !engine.masked_ids.is_empty(),
        "the fixture's vocabulary is padded past its tokenizer's"
    );
    assert!(engine
        .masked_ids
        .iter()
        .all(|&id| id < vocab && !tok.can_decode(id)));
    let gap = *engine.masked_ids.last().unwrap();
    // A bias that would make the gap id the argmax at every step, greedy and sampled.
    for temperature in [0.0, 1.0] {
        let mut r = greedy(golden_prompts("qwen3-moe-tiny")[0].clone(), 12);
        r.sampling.logit_bias = vec![(gap, 100.0)];
        r.sampling.temperature = temperature;
        r.sampling.seed = 3;
        let ids = engine
            .generate(std::slice::from_ref(&r), |_, _| {})
            .unwrap()
            .remove(0);
        assert_eq!(ids.len(), 12);
        assert!(ids.iter().all(|&id| tok.can_decode(id)), "sampled {ids:?}");
    }
}

#[test]
fn a_panic_in_the_model_ends_the_step_with_an_error() {
    let mut engine = load("qwen3-moe-tiny");
    let prompts = golden_prompts("qwen3-moe-tiny");
    engine.faults.panic_on_token = Some(prompts[0][0]);
    let mut batch = Batch::new(&engine);
    batch
        .add(0, greedy(prompts[0].clone(), 4), RequestExtras::default())
        .unwrap();
    let err = batch.step(&mut |_, _| true).unwrap_err();
    assert!(matches!(err, EngineError::ModelPanicked(_)), "{err}");
    assert!(batch.is_empty());
    drop(batch);
    // The engine itself still answers (the caller decides whether to go on).
    engine.faults.panic_on_token = None;
    assert_eq!(
        engine
            .generate(&[greedy(prompts[1].clone(), 3)], |_, _| {})
            .unwrap()[0]
            .len(),
        3
    );
}
