//! `strata trace FILE`: a routing trace (`strata run --trace FILE`, `strata bench --trace
//! FILE`) replayed against the expert cache's policies at several capacities, beside Belady's
//! optimum, and the next-layer guess (`--prefetch`) and the previous token's experts scored as
//! predictors of what each layer asks for.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use strata_experts::replay::{hits, Group, Policy, Requests};
use strata_experts::Eviction;

#[derive(clap::Args)]
pub struct TraceArgs {
    /// The trace written by `--trace` (`strata run --trace FILE`, `strata bench --trace FILE`).
    file: PathBuf,
    /// Cache capacities to replay, as shares of all experts (`25%`) or numbers of experts.
    #[arg(long, value_delimiter = ',', default_value = "5%,10%,25%,50%,75%")]
    sizes: Vec<String>,
    /// The LFU policy's half-life, in expert accesses (as `--lfu-half-life`).
    #[arg(long, default_value_t = 4096)]
    lfu_half_life: u64,
    /// Print the figures as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// The header's facts and the requests.
struct Trace {
    moe_layers: usize,
    n_experts: usize,
    requests: Requests,
}

fn numbers(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?
        .iter()
        .map(|n| n.as_u64().map(|n| n as usize))
        .collect()
}

fn read(path: &PathBuf) -> Result<Trace> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines().enumerate();
    let bad = |n: usize, why: &str| anyhow::anyhow!("{}:{}: {why}", path.display(), n + 1);
    let (n, head) = lines.next().ok_or_else(|| bad(0, "empty: not a routing trace"))?;
    let head: Value = serde_json::from_str(head).map_err(|_| bad(n, "not JSON"))?;
    if head["trace"] != "strata routing" {
        bail!(bad(n, "not a strata routing trace (written by --trace)"));
    }
    let moe_layers = numbers(&head["moe_layers"])
        .ok_or_else(|| bad(n, "no `moe_layers`"))?
        .len();
    let n_experts = head["n_experts"]
        .as_u64()
        .ok_or_else(|| bad(n, "no `n_experts`"))? as usize;
    let mut requests = Requests::default();
    let mut pending: Vec<(usize, Vec<usize>)> = Vec::new();
    for (n, line) in lines {
        let v: Value = serde_json::from_str(line).map_err(|_| bad(n, "not JSON"))?;
        let layer = v["layer"].as_u64().ok_or_else(|| bad(n, "no `layer`"))? as usize;
        if let Some(guess) = v.get("guess") {
            pending.push((
                layer,
                numbers(guess).ok_or_else(|| bad(n, "`guess` is not a list of ids"))?,
            ));
            continue;
        }
        let tokens = (v["tokens"]
            .as_array()
            .ok_or_else(|| bad(n, "no `tokens`"))?
            .iter())
        .map(numbers)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad(n, "`tokens` is not lists of ids"))?;
        if tokens.iter().flatten().any(|&e| e >= n_experts) {
            bail!(bad(n, "an expert id beyond n_experts"));
        }
        let at = requests.groups.len();
        for (_, guess) in pending.extract_if(.., |(l, _)| *l == layer) {
            requests.guesses.push((at, guess));
        }
        requests.groups.push(Group { layer, tokens });
    }
    Ok(Trace {
        moe_layers,
        n_experts,
        requests,
    })
}

/// A capacity in experts from `25%` (of `all`) or `40`.
fn capacity(text: &str, all: usize) -> Result<usize> {
    let t = text.trim();
    let n = match t.strip_suffix('%') {
        Some(p) => (p
            .trim()
            .parse::<f64>()
            .with_context(|| format!("--sizes: `{text}`"))?
            / 100.0
            * all as f64)
            .round() as usize,
        None => t
            .parse()
            .with_context(|| format!("--sizes: `{text}` is not a share (25%) or a count"))?,
    };
    Ok(n.min(all))
}

pub fn trace(args: TraceArgs) -> Result<()> {
    let t = read(&args.file)?;
    let all = t.moe_layers * t.n_experts;
    let steps = t.requests.accesses();
    let accesses: usize = steps.iter().map(Vec::len).sum();
    let lfu = Eviction::LfuDecay {
        half_life: args.lfu_half_life,
    };
    let policies = [
        ("lru", Policy::Cache(Eviction::Lru)),
        ("lfu", Policy::Cache(lfu)),
        ("belady", Policy::Belady),
    ];
    let mut rows = Vec::new();
    for size in &args.sizes {
        let cap = capacity(size, all)?;
        let mut row = json!({"experts": cap, "share": cap as f64 / all.max(1) as f64});
        for (name, p) in policies {
            row[name] = json!(hits(p, cap, &steps) as f64 / accesses.max(1) as f64);
        }
        rows.push(row);
    }
    let (g_recall, g_precision, g_n) = t.requests.guess_coverage();
    let (p_recall, p_precision, p_n) = t.requests.previous_token_coverage();
    let one_token = t.requests.groups.iter().filter(|g| g.tokens.len() == 1).count();
    let out = json!({
        "moe_layers": t.moe_layers, "n_experts": t.n_experts, "groups": t.requests.groups.len(),
        "one_token_groups": one_token, "accesses": accesses, "hit_rates": rows,
        "lfu_half_life": args.lfu_half_life,
        "next_layer_guess": {"recall": g_recall, "precision": g_precision, "layers": g_n},
        "previous_token": {"recall": p_recall, "precision": p_precision, "pairs": p_n},
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: {} MoE layers x {} experts ({all}), {} layer steps ({one_token} of one token), {} expert accesses",
        args.file.display(),
        t.moe_layers,
        t.n_experts,
        t.requests.groups.len(),
        accesses
    );
    println!(
        "cache (experts)   LRU      LFU (half-life {})   Belady (optimum)",
        args.lfu_half_life
    );
    for r in &rows {
        let pct = |k: &str| r[k].as_f64().unwrap_or(0.0) * 100.0;
        println!(
            "{:>5} ({:>5.1} %)   {:>5.1} %   {:>5.1} %               {:>5.1} %",
            r["experts"],
            pct("share"),
            pct("lru"),
            pct("lfu"),
            pct("belady")
        );
    }
    if g_n > 0 {
        println!(
            "next layer's guess (what --prefetch reads): recall {:.1} %, precision {:.1} % over {g_n} layer steps",
            g_recall * 100.0,
            g_precision * 100.0
        );
    } else {
        println!("next layer's guess: none in this trace (a model with one MoE layer makes none)");
    }
    println!(
        "previous token's experts at the same layer: recall {:.1} % over {p_n} pairs",
        p_recall * 100.0
    );
    let _ = p_precision;
    Ok(())
}
