//! Stop strings across token boundaries: text is held back while it could still be the start of a
//! stop string, and a found stop string is never emitted.

#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string was hit).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > hold && self.pending.ends_with(&s[..i]) {
                    hold = i;
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Releases whatever is held (at the end of generation).
    pub fn finish(&mut self) -> String {
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
}
