//! The generation loop's contracts: batching does not change any sequence's output, the same
//! seed gives the same samples, stop strings cut the text and are never emitted, EOS stops, and
//! streamed text is the decoded text with no broken characters.

use strata_runtime::{Engine, FinishReason, GenEvent, LoadOptions, Request, SamplingParams};
use strata_testkit::{as_u32s, fixture, golden};

fn load(name: &str) -> Engine {
    Engine::load(&fixture(name), &LoadOptions::default()).unwrap()
}

fn request(prompt: Vec<u32>, n: usize, sampling: SamplingParams) -> Request {
    Request {
        prompt,
        max_new_tokens: n,
        sampling,
        stop: vec![],
        ignore_eos: true,
    }
}

/// Runs requests together; returns (ids, streamed text, finish reason) per request.
fn run(engine: &Engine, requests: &[Request]) -> Vec<(Vec<u32>, String, Option<FinishReason>)> {
    let mut texts = vec![String::new(); requests.len()];
    let mut reasons = vec![None; requests.len()];
    let ids = engine
        .generate(requests, |i, e| match e {
            GenEvent::Token { text, .. } => texts[i].push_str(text),
            GenEvent::Done { reason } => reasons[i] = Some(reason),
            GenEvent::Failed { error } => panic!("request {i} failed: {error}"),
        })
        .unwrap();
    ids.into_iter()
        .zip(texts)
        .zip(reasons)
        .map(|((a, b), c)| (a, b, c))
        .collect()
}

#[test]
fn a_batch_gives_each_sequence_exactly_its_solo_output() {
    for name in ["deepseek-v3-tiny", "qwen3-moe-tiny"] {
        let engine = load(name);
        let g = golden(name);
        let prompts: Vec<Vec<u32>> = g["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| as_u32s(&p["ids"]))
            .collect();
        let sampled = SamplingParams {
            temperature: 0.9,
            top_k: 50,
            seed: 11,
            ..Default::default()
        };
        let requests: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                request(
                    p.clone(),
                    6 + 3 * i,
                    if i % 2 == 0 {
                        SamplingParams::default()
                    } else {
                        sampled.clone()
                    },
                )
            })
            .collect();
        let together = run(&engine, &requests);
        for (i, r) in requests.iter().enumerate() {
            let alone = run(&engine, std::slice::from_ref(r)).remove(0);
            assert_eq!(together[i].0, alone.0, "{name}: request {i} differs in a batch");
            assert_eq!(
                together[i].1, alone.1,
                "{name}: request {i} text differs in a batch"
            );
            assert_eq!(together[i].0.len(), r.max_new_tokens);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_sample_and_another_seed_differs() {
    let engine = load("mixtral-tiny");
    let prompt = as_u32s(&golden("mixtral-tiny")["prompts"][1]["ids"]);
    let params = |seed| SamplingParams {
        temperature: 1.5,
        seed,
        ..Default::default()
    };
    let a = run(&engine, &[request(prompt.clone(), 16, params(1))])
        .remove(0)
        .0;
    let b = run(&engine, &[request(prompt.clone(), 16, params(1))])
        .remove(0)
        .0;
    let c = run(&engine, &[request(prompt, 16, params(2))]).remove(0).0;
    assert_eq!(a, b);
    assert_ne!(a, c, "two seeds gave the same 16 sampled tokens");
}

#[test]
fn stop_strings_cut_the_text_and_eos_stops() {
    let engine = load("qwen3-moe-tiny");
    let tok = engine.tokenizer().unwrap();
    let prompt = as_u32s(&golden("qwen3-moe-tiny")["prompts"][2]["ids"]);
    let (ids, full, reason) =
        run(&engine, &[request(prompt.clone(), 24, SamplingParams::default())]).remove(0);
    assert_eq!(reason, Some(FinishReason::Length));
    assert_eq!(
        full,
        tok.decode(&ids, true).unwrap(),
        "streamed text is not the decoded text"
    );

    // A stop string taken from the middle of the output (spanning tokens where possible).
    let chars: Vec<char> = full.chars().collect();
    assert!(
        chars.len() > 10,
        "output too short to pick a stop string: {full:?}"
    );
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let mut req = request(prompt.clone(), 24, SamplingParams::default());
    req.stop = vec![stop.clone()];
    let (_, text, reason) = run(&engine, &[req]).remove(0);
    assert_eq!(reason, Some(FinishReason::Stop));
    let cut = full.find(&stop).unwrap();
    assert_eq!(text, full[..cut], "text must end right before the stop string");

    // EOS: make the first greedy token the EOS and it must stop there.
    let first = ids[0];
    let mut engine = engine;
    engine.generation.eos_token_ids = vec![first];
    let mut req = request(prompt, 24, SamplingParams::default());
    req.ignore_eos = false;
    let (ids, _, reason) = run(&engine, &[req]).remove(0);
    assert_eq!((ids, reason), (vec![first], Some(FinishReason::Stop)));
}

#[test]
fn streaming_never_emits_a_broken_character() {
    let engine = load("qwen3-moe-tiny");
    let tok = engine.tokenizer().unwrap();
    let text = "Grüße 👨‍👩‍👧 你好世界 — naïve café 🎉 end";
    let ids = tok.encode(text, false).unwrap();
    let mut dec = strata_tokenizer::StreamDecoder::new(false);
    let mut out = String::new();
    for &id in &ids {
        if let Some(delta) = dec.push(tok, id).unwrap() {
            assert!(!delta.contains('\u{FFFD}'), "broken character emitted: {delta:?}");
            out.push_str(&delta);
        }
    }
    if let Some(rest) = dec.flush(tok).unwrap() {
        out.push_str(&rest);
    }
    assert_eq!(out, text);
}

/// A held sequence sits out the steps (its consumer is behind) and, released, goes on to
/// exactly the output it would have had; the others run meanwhile.
#[test]
fn a_held_sequence_waits_and_then_gives_its_own_output() {
    use strata_runtime::{Batch, RequestExtras};
    let engine = load("qwen3-moe-tiny");
    let prompts: Vec<Vec<u32>> = golden("qwen3-moe-tiny")["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .take(2)
        .map(|p| as_u32s(&p["ids"]))
        .collect();
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| request(p.clone(), 8, SamplingParams::default()))
        .collect();
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| run(&engine, std::slice::from_ref(r)).remove(0).0)
        .collect();
    let mut batch = Batch::new(&engine);
    for (i, r) in requests.iter().enumerate() {
        batch.add(i as u64, r.clone(), RequestExtras::default()).unwrap();
    }
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 2];
    let step = |batch: &mut Batch, got: &mut Vec<Vec<u32>>| {
        batch
            .step(&mut |id, e| {
                if let GenEvent::Token { id: tok, .. } = e {
                    got[id as usize].push(tok);
                }
                true
            })
            .unwrap()
    };
    batch.hold(1, true);
    for _ in 0..4 {
        step(&mut batch, &mut got);
    }
    assert!(!batch.all_held());
    batch.hold(0, true);
    assert!(batch.all_held());
    step(&mut batch, &mut got); // nothing to do
    assert!(!got[0].is_empty(), "the sequence not held made no progress");
    assert!(got[1].is_empty(), "a held sequence made tokens");
    batch.hold(0, false);
    batch.hold(1, false);
    while !batch.is_empty() {
        step(&mut batch, &mut got);
    }
    assert_eq!(got, alone);
}
