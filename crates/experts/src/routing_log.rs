//! `--trace FILE`: every routing decision the store is told of, one JSON line per MoE layer and
//! step, in the order the store sees them: `{"layer": L, "tokens": [[experts of token 0], ...]}`,
//! and each guess of a layer's experts made from the layer before (what `--prefetch` reads; made
//! whether or not it is on), `{"layer": L, "guess": [...]}`, before that layer's own line. The first line says what the trace is of:
//! `{"trace": "strata routing", "moe_layers": [...], "n_experts": E, "top_k": K, "expert_bytes": B}`.
//! [`crate::replay`] reads it back (`strata trace FILE`).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use strata_weights::ExpertLayout;

pub struct RoutingLog {
    out: Mutex<BufWriter<File>>,
}

fn list(out: &mut String, ids: impl IntoIterator<Item = usize>) {
    out.push('[');
    for (i, e) in ids.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{e}");
    }
    out.push(']');
}

impl RoutingLog {
    /// Creates `path` and writes the header line for `layout`.
    pub fn create(path: &Path, layout: &ExpertLayout, expert_bytes: u64) -> std::io::Result<RoutingLog> {
        let mut out = BufWriter::new(File::create(path)?);
        let mut line = String::from("{\"trace\":\"strata routing\",\"moe_layers\":");
        list(&mut line, layout.moe_layers.iter().copied());
        let _ = writeln!(
            line,
            ",\"n_experts\":{},\"top_k\":{},\"expert_bytes\":{expert_bytes}}}",
            layout.n_experts, layout.top_k
        );
        out.write_all(line.as_bytes())?;
        Ok(RoutingLog { out: Mutex::new(out) })
    }

    fn write(&self, line: &str) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = out.write_all(line.as_bytes()) {
            tracing::warn!("--trace: {e}");
        }
    }

    /// One layer's step: each token's experts.
    pub fn routed(&self, layer: usize, tokens: &[&[usize]]) {
        let mut line = format!("{{\"layer\":{layer},\"tokens\":[");
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            list(&mut line, t.iter().copied());
        }
        line.push_str("]}\n");
        self.write(&line);
    }

    /// A guess of a layer's experts (`--prefetch`).
    pub fn guessed(&self, layer: usize, ids: &[usize]) {
        let mut line = format!("{{\"layer\":{layer},\"guess\":");
        list(&mut line, ids.iter().copied());
        line.push_str("}\n");
        self.write(&line);
    }

    /// Writes out what is buffered.
    pub fn flush(&self) -> std::io::Result<()> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}
