//! Stop strings across token boundaries: text is held back while it could still be the start of a
//! stop string, and a found stop string is never emitted. Each stop string is matched by a
//! Knuth-Morris-Pratt automaton over the bytes as they arrive, so the cost is linear in the text
//! whatever the stop strings are, and what is held back is at most the longest stop string.
//! The stop string completed first ends the text; nothing from its start on is emitted.

#[derive(Clone, Debug)]
struct Stop {
    pattern: Vec<u8>,
    /// fail[i]: the longest proper prefix of pattern[..=i] that is also its suffix.
    fail: Vec<usize>,
    /// Bytes of the pattern matched by the end of the text so far.
    matched: usize,
}

impl Stop {
    fn new(pattern: &str) -> Stop {
        let p = pattern.as_bytes();
        let mut fail = vec![0; p.len()];
        let mut k = 0;
        for i in 1..p.len() {
            while k > 0 && p[i] != p[k] {
                k = fail[k - 1];
            }
            if p[i] == p[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Stop {
            pattern: p.to_vec(),
            fail,
            matched: 0,
        }
    }

    /// Advances over one byte; true when the whole pattern has just matched.
    fn step(&mut self, b: u8) -> bool {
        let p = &self.pattern;
        let mut k = self.matched;
        while k > 0 && p[k] != b {
            k = self.fail[k - 1];
        }
        if p[k] == b {
            k += 1;
        }
        self.matched = k;
        k == p.len()
    }
}

#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<Stop>,
    /// Text received but not yet released (a suffix that may begin a stop string).
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| Stop::new(s))
                .collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string was hit).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        let held = self.pending.len();
        for (i, &b) in text.as_bytes().iter().enumerate() {
            let mut hit = None;
            for s in &mut self.stops {
                if s.step(b) {
                    // Of stops ending at the same byte, the longest starts first.
                    hit = Some(hit.map_or(s.pattern.len(), |h: usize| h.max(s.pattern.len())));
                }
            }
            if let Some(len) = hit {
                // The match ends at byte i of `text`, byte held + i of pending + text.
                let start = held + i + 1 - len;
                self.pending.push_str(text);
                let mut out = std::mem::take(&mut self.pending);
                out.truncate(start);
                self.stops.iter_mut().for_each(|s| s.matched = 0);
                return (out, true);
            }
        }
        self.pending.push_str(text);
        // Hold back the longest suffix that is a prefix of some stop string.
        let hold = self.stops.iter().map(|s| s.matched).max().unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Releases whatever is held (at the end of generation).
    pub fn finish(&mut self) -> String {
        self.stops.iter_mut().for_each(|s| s.matched = 0);
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_spanning_pieces_is_cut_and_never_emitted() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abc E"), ("abc ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("Dxyz"), ("".into(), true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("E"), ("".into(), false));
        assert_eq!(m.push("x"), ("Ex".into(), false));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn overlapping_prefixes_and_multibyte_text() {
        // "aab" inside "aaab": the automaton falls back instead of restarting.
        let mut m = StopMatcher::new(vec!["aab".into()]);
        assert_eq!(m.push("xaa"), ("x".into(), false));
        assert_eq!(m.push("ab!"), ("a".into(), true));
        // Held text is cut on character boundaries.
        let mut m = StopMatcher::new(vec!["éé".into()]);
        assert_eq!(m.push("añé"), ("añ".into(), false));
        assert_eq!(m.push("x"), ("éx".into(), false));
        // The stop completed first wins; text of several stops.
        let mut m = StopMatcher::new(vec!["long stop".into(), "op".into()]);
        assert_eq!(m.push("a long stop"), ("a ".into(), true));
        let mut m = StopMatcher::new(vec!["xyz".into(), "y".into()]);
        assert_eq!(m.push("axyz"), ("ax".into(), true));
    }

    /// Against the plain definition: emitted text + held text is the input, no emitted text
    /// contains a stop, and a hit cuts at the first completed stop.
    #[test]
    fn agrees_with_a_plain_search_on_random_pieces() {
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..2000 {
            let stops: Vec<String> = (0..1 + next(3))
                .map(|_| {
                    (0..1 + next(4))
                        .map(|_| ['a', 'b', 'é'][next(3) as usize])
                        .collect()
                })
                .collect();
            let text: String = (0..next(40))
                .map(|_| ['a', 'b', 'é', 'c'][next(4) as usize])
                .collect();
            let mut m = StopMatcher::new(stops.clone());
            let (mut out, mut hit) = (String::new(), false);
            let mut rest = text.as_str();
            while !rest.is_empty() && !hit {
                let mut n = 1 + next(5) as usize;
                while n < rest.len() && !rest.is_char_boundary(n) {
                    n += 1;
                }
                let (piece, tail) = rest.split_at(n.min(rest.len()));
                let (o, h) = m.push(piece);
                out.push_str(&o);
                hit = h;
                rest = tail;
            }
            // The first completed stop: the smallest end, then any start.
            let first_end = stops
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), s.len())))
                .min_by_key(|&(end, len)| (end, std::cmp::Reverse(len)));
            match first_end {
                Some((end, len)) => {
                    assert!(hit, "{stops:?} {text:?}");
                    assert_eq!(out, text[..end - len], "{stops:?} {text:?}");
                }
                None => {
                    assert!(!hit, "{stops:?} {text:?}");
                    out.push_str(&m.finish());
                    assert_eq!(out, text, "{stops:?} {text:?}");
                }
            }
        }
    }
}
