//! Where a token's time goes, product by product, on machines with no profiler at hand (the
//! device hosts have no `perf`): with `STRATA_PROFILE=1` every matrix product records its wall
//! time by format, shape and token count, and named spans ([`span`]) record the work between
//! products (attention cores, norms, routing). `strata bench` prints the totals for the prompt
//! and for the decode. Off (the default), a product pays one relaxed load.
//!
//! A product or span that runs inside another's task (the routed experts side by side on the
//! kernels' threads) is marked `nested`: its times overlap others' and add up to more than the
//! wall time they took.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What one row of the profile counts: a product's format and shape, or a span's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub what: String,
    /// Several tokens per call (a prompt's products), or one.
    pub several: bool,
    pub nested: bool,
}

/// Totals of one [`Key`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    pub calls: u64,
    pub ns: u64,
    /// Weight bytes the calls read (each call counts its matrix once); 0 for spans.
    pub bytes: u64,
    pub tokens: u64,
}

/// 0 unknown, 1 off, 2 on.
static STATE: AtomicU8 = AtomicU8::new(0);
static TOTALS: Mutex<Option<HashMap<Key, Stat>>> = Mutex::new(None);

/// Whether `STRATA_PROFILE` is set to something other than `0` (read once).
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("STRATA_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

fn add(key: Key, stat: Stat) {
    let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let s = totals.get_or_insert_with(HashMap::new).entry(key).or_default();
    s.calls += stat.calls;
    s.ns += stat.ns;
    s.bytes += stat.bytes;
    s.tokens += stat.tokens;
}

fn nested() -> bool {
    rayon::current_thread_index().is_some()
}

/// Records a product of `format` weights, `out` x `in_dim`, over `tokens` tokens, that read
/// `bytes` of weights since `t0`.
pub(crate) fn product(format: &str, out: usize, in_dim: usize, tokens: usize, bytes: usize, t0: Instant) {
    let ns = t0.elapsed().as_nanos() as u64;
    add(
        Key {
            what: format!("{format} {out}x{in_dim}"),
            several: tokens > 1,
            nested: nested(),
        },
        Stat {
            calls: 1,
            ns,
            bytes: bytes as u64,
            tokens: tokens as u64,
        },
    );
}

/// Runs `f`, recording its wall time under `name` when profiling is on.
#[inline]
pub fn span<T>(name: &'static str, tokens: usize, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    record(name, tokens, t0.elapsed());
    out
}

/// Adds `took` to span `name`'s row (for spans whose parts are timed apart).
pub fn record(name: &str, tokens: usize, took: std::time::Duration) {
    add(
        Key {
            what: name.to_string(),
            several: tokens > 1,
            nested: nested(),
        },
        Stat {
            calls: 1,
            ns: took.as_nanos() as u64,
            bytes: 0,
            tokens: tokens as u64,
        },
    );
}

/// Every row so far.
pub fn snapshot() -> HashMap<Key, Stat> {
    TOTALS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

/// The rows of `after` less those of `before` (what ran in between), largest time first.
pub fn between(before: &HashMap<Key, Stat>, after: &HashMap<Key, Stat>) -> Vec<(Key, Stat)> {
    let mut rows: Vec<(Key, Stat)> = after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            let d = Stat {
                calls: a.calls - b.calls,
                ns: a.ns - b.ns,
                bytes: a.bytes - b.bytes,
                tokens: a.tokens - b.tokens,
            };
            (k.clone(), d)
        })
        .filter(|(_, d)| d.calls > 0)
        .collect();
    rows.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then_with(|| a.0.cmp(&b.0)));
    rows
}

/// `rows` as a table: per row the calls per `per` (tokens), milliseconds per `per`, microseconds
/// per call, and for products the weights' read rate in GB/s.
pub fn table(rows: &[(Key, Stat)], per: f64) -> String {
    let mut s = format!(
        "{:<40} {:>7} {:>9} {:>10} {:>8}\n",
        "product or span", "calls", "ms", "us/call", "GB/s"
    );
    for (k, st) in rows {
        let name = format!(
            "{}{}{}",
            k.what,
            if k.several { " (tokens)" } else { "" },
            if k.nested { " nested" } else { "" }
        );
        let secs = st.ns as f64 * 1e-9;
        let gbs = if st.bytes > 0 && secs > 0.0 {
            format!("{:.1}", st.bytes as f64 / secs / 1e9)
        } else {
            "-".to_string()
        };
        s += &format!(
            "{:<40} {:>7.1} {:>9.3} {:>10.1} {:>8}\n",
            name,
            st.calls as f64 / per,
            secs * 1e3 / per,
            secs * 1e6 / st.calls as f64,
            gbs
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn between_takes_the_difference_largest_first() {
        let k = |w: &str| Key {
            what: w.to_string(),
            several: false,
            nested: false,
        };
        let st = |calls, ns| Stat {
            calls,
            ns,
            bytes: 10 * calls,
            tokens: calls,
        };
        let before = HashMap::from([(k("a"), st(1, 100))]);
        let after = HashMap::from([(k("a"), st(3, 400)), (k("b"), st(1, 500)), (k("c"), st(0, 0))]);
        let rows = between(&before, &after);
        assert_eq!(rows, vec![(k("b"), st(1, 500)), (k("a"), st(2, 300))]);
        let t = table(&rows, 2.0);
        assert!(t.contains("b "), "{t}");
        assert_eq!(t.lines().count(), 3, "{t}");
    }
}
