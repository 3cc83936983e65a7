//! Stop strings over streamed pieces: what is emitted plus what is held is the input up to the
//! first completed stop, and a hit cuts exactly there (checked against a plain search).
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_runtime::StopMatcher;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `stop1|stop2|...\ntext` with pieces cut at `\u{1}`.
    let Some((stops, body)) = text.split_once('\n') else {
        return;
    };
    let stops: Vec<String> = stops.split('|').take(4).map(str::to_string).collect();
    let pieces: Vec<&str> = body.split('\u{1}').collect();
    let whole: String = pieces.concat();
    let mut m = StopMatcher::new(stops.clone());
    let (mut out, mut hit) = (String::new(), false);
    for p in &pieces {
        let (o, h) = m.push(p);
        out.push_str(&o);
        if h {
            hit = true;
            break;
        }
    }
    let first = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| whole.find(s.as_str()).map(|at| (at + s.len(), s.len())))
        .min_by_key(|&(end, len)| (end, std::cmp::Reverse(len)));
    match first {
        Some((end, len)) => {
            assert!(hit);
            assert_eq!(out, whole[..end - len]);
        }
        None => {
            assert!(!hit);
            out.push_str(&m.finish());
            assert_eq!(out, whole);
        }
    }
});
