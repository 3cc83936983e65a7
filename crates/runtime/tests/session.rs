//! A conversation's cache kept between turns (`Session`): a turn feeds only what its cache does
//! not hold, and answers exactly as the same prompt from an empty cache does; a stopped answer
//! is kept as far as it went; a recurrent model, which cannot rewind, resumes at the latest
//! copy of its state kept as its prompt was fed (each prefill chunk's end, the prompt's end).

use strata_runtime::{Engine, GenEvent, LoadOptions, Request, SamplingParams, Session};
use strata_testkit::{fixture, golden_prompts};

fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    Request {
        prompt,
        max_new_tokens: n,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: vec![],
        ignore_eos: true,
    }
}

/// The greedy answer from an empty cache.
fn scratch(engine: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    engine
        .generate(&[greedy(prompt.to_vec(), n)], |_, _| {})
        .unwrap()
        .remove(0)
}

#[test]
fn a_turn_feeds_only_its_new_tokens_and_answers_as_from_scratch() {
    for name in ["qwen3-moe-tiny", "deepseek-v3-tiny", "kimi-linear-tiny"] {
        let engine = Engine::load(&fixture(name), &LoadOptions::default()).unwrap();
        let ps = golden_prompts(name);
        let (first, extra) = (&ps[0], &ps[ps.len() - 1]);
        let mut session = Session::new();
        let n = 6;
        let t1 = engine
            .generate_in(&mut session, &greedy(first.clone(), n), |_| true, |_, _| {})
            .unwrap();
        assert_eq!((t1.reused, t1.fed), (0, first.len()), "{name}");
        assert_eq!(t1.generated, scratch(&engine, first, n), "{name}: first turn");
        // The cache holds the prompt and the answer but its last token (sampled, not fed).
        assert_eq!(session.len(), first.len() + n - 1, "{name}");

        let second: Vec<u32> = first.iter().chain(&t1.generated).chain(extra).copied().collect();
        let t2 = engine
            .generate_in(&mut session, &greedy(second.clone(), n), |_| true, |_, _| {})
            .unwrap();
        assert_eq!(t2.reused, first.len() + n - 1, "{name}");
        assert_eq!(t2.fed, second.len() - t2.reused, "{name}");
        assert_eq!(t2.generated, scratch(&engine, &second, n), "{name}: second turn");
    }
}

#[test]
fn a_prompt_that_leaves_the_cache_rewinds_it_or_resumes_at_a_mark() {
    for (name, recurrent) in [("qwen3-moe-tiny", false), ("kimi-linear-tiny", true)] {
        let ps = golden_prompts(name);
        let first = ps.iter().max_by_key(|p| p.len()).unwrap().clone();
        let half = first.len() / 2;
        // Chunks that end within the shared half, so a recurrent state has a mark there.
        let chunk = (half / 2).max(1);
        let options = LoadOptions {
            prefill_chunk: Some(chunk),
            ..Default::default()
        };
        let engine = Engine::load(&fixture(name), &options).unwrap();
        // Where a state resumes within `common` tokens: anywhere, or a chunk's end.
        let at = |common: usize| if recurrent { common / chunk * chunk } else { common };
        let mut session = Session::new();
        engine
            .generate_in(&mut session, &greedy(first.clone(), 4), |_| true, |_, _| {})
            .unwrap();
        // The same first half, then something else.
        assert!(at(half) > 0, "{name}: a prompt too short to test");
        let then = ps
            .iter()
            .find(|p| p[0] != first[half])
            .expect("a prompt that leaves");
        let other: Vec<u32> = first[..half].iter().chain(then).copied().collect();
        let t = engine
            .generate_in(&mut session, &greedy(other.clone(), 5), |_| true, |_, _| {})
            .unwrap();
        assert_eq!(t.reused, at(half), "{name}");
        assert_eq!(t.generated, scratch(&engine, &other, 5), "{name}");
        // The whole prompt again: all but its last token reused (the cache holds the answer
        // too: a recurrent state cannot drop it, so resumes at a chunk's end), the same answer.
        let again = engine
            .generate_in(&mut session, &greedy(other.clone(), 5), |_| true, |_, _| {})
            .unwrap();
        assert_eq!(again.reused, at(other.len() - 1), "{name}");
        assert_eq!(again.generated, t.generated, "{name}");
    }
}

#[test]
fn a_stopped_answer_is_kept_as_far_as_it_went() {
    let engine = Engine::load(&fixture("qwen3-moe-tiny"), &LoadOptions::default()).unwrap();
    let ps = golden_prompts("qwen3-moe-tiny");
    let mut session = Session::new();
    let mut seen = 0;
    let t = engine
        .generate_in(
            &mut session,
            &greedy(ps[0].clone(), 50),
            |e| {
                if let GenEvent::Token { .. } = e {
                    seen += 1;
                }
                seen < 3
            },
            |_, _| {},
        )
        .unwrap();
    assert_eq!(t.finish, None);
    assert_eq!(t.generated.len(), 3);
    assert_eq!(t.generated, scratch(&engine, &ps[0], 3));
    assert_eq!(session.len(), ps[0].len() + 2);
    // The next turn goes on from there.
    let next: Vec<u32> = ps[0].iter().chain(&t.generated).chain(&ps[1]).copied().collect();
    let t2 = engine
        .generate_in(&mut session, &greedy(next.clone(), 4), |_| true, |_, _| {})
        .unwrap();
    assert_eq!(t2.reused, ps[0].len() + 2);
    assert_eq!(t2.generated, scratch(&engine, &next, 4));
    // reset: nothing reused.
    session.reset();
    let t3 = engine
        .generate_in(&mut session, &greedy(next.clone(), 4), |_| true, |_, _| {})
        .unwrap();
    assert_eq!((t3.reused, t3.generated), (0, t2.generated));
}

#[test]
fn a_prompt_fed_over_several_steps_tells_its_progress() {
    let options = LoadOptions {
        prefill_chunk: Some(4),
        ..Default::default()
    };
    let engine = Engine::load(&fixture("qwen3-moe-tiny"), &options).unwrap();
    let ps = golden_prompts("qwen3-moe-tiny");
    let long = ps.iter().max_by_key(|p| p.len()).unwrap();
    let mut told = Vec::new();
    let mut session = Session::new();
    let t = engine
        .generate_in(
            &mut session,
            &greedy(long.clone(), 2),
            |_| true,
            |done, total| told.push((done, total)),
        )
        .unwrap();
    // Every step but the last: 4 more tokens in.
    let want: Vec<(usize, usize)> = (1..long.len().div_ceil(4)).map(|k| (4 * k, long.len())).collect();
    assert_eq!(told, want);
    assert_eq!(t.generated, scratch(&engine, long, 2));
}
