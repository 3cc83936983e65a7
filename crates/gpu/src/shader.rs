//! The product shader's `main`, written out for one tile: every row, token and group of a
//! workgroup's step is its own statement on its own variables (no arrays indexed in loops, which
//! compilers may keep in memory instead of registers), and a one-token tile loads up to four
//! groups of weights before it uses the first, so their reads overlap.
//!
//! Each output's sum is the same whatever the tile: invocation l adds the products of groups
//! l, l + 64, l + 128, ... in order, then the 64 sums go through a fixed tree (`matmul.wgsl`).
//! A float format's group is eight fused multiply-adds into the sum in input order; a packed
//! format's group sums its eight values times the activations in input order, and that sum times
//! the group's scale goes into the sum with one more (one multiplication by the scale a group,
//! where each weight times its scale took eight). INT4 rows of whole groups of 32 inputs under
//! one scale each (every checkpoint's) take groups of 32 instead (`step32`): invocation l takes
//! groups l, l + 64, ... of 32, the 32 codes times the inputs in input order, then that sum times
//! the scale; their 16 bytes come in one load and their scale once.

use std::fmt::Write;

use crate::matrix::{Tile, WeightFormat};

/// The whole WGSL of `format`'s product through `tile`; `grouped`: the form whose workgroups
/// each take one item of a table (an expert's matrix, rows and block of tokens), so one dispatch
/// runs the products of several experts, each output's sum the same as the plain form's.
pub(crate) fn matmul_source(format: WeightFormat, tile: Tile, grouped: bool) -> String {
    let float = include_str!("shaders/float.wgsl");
    let packed = include_str!("shaders/packed.wgsl");
    let functions = match format {
        WeightFormat::Bf16 => [include_str!("shaders/bf16.wgsl"), float].concat(),
        WeightFormat::F16 => [include_str!("shaders/f16.wgsl"), float].concat(),
        WeightFormat::F32 => [include_str!("shaders/f32.wgsl"), float].concat(),
        WeightFormat::Int8 => [packed, include_str!("shaders/int8.wgsl")].concat(),
        WeightFormat::Fp8 => [packed, include_str!("shaders/fp8.wgsl")].concat(),
        WeightFormat::Int4 => [packed, include_str!("shaders/int4.wgsl")].concat(),
        WeightFormat::Mxfp4 => [packed, include_str!("shaders/mxfp4.wgsl")].concat(),
    };
    let word = if format == WeightFormat::F32 { "f32" } else { "u32" };
    let mut s = include_str!("shaders/matmul.wgsl")
        .replace("WORD", word)
        .replace("ROWS_PER_GROUP", &tile.rows.to_string())
        .replace("TOKENS_PER_GROUP", &tile.tokens.to_string())
        .replace("FORMAT_FUNCTIONS", &functions);
    if grouped {
        s.push_str(
            "
// The grouped form's items: (the expert's matrix's start in `w` as `wb` takes it, its first
// packed row in x and y, its number of rows, the first of them this workgroup takes).
@group(0) @binding(4) var<storage, read> items: array<vec4<u32>>;
",
        );
    }
    main(
        &mut s,
        tile.rows as usize,
        tile.tokens as usize,
        grouped,
        format.packed(),
        format == WeightFormat::Int4,
    );
    s
}

/// Groups of weights a one-token tile loads ahead.
const AHEAD: usize = 4;

/// `wide`: the format has `wide32`, `wvec` and `codes8` (INT4): rows of whole 32-input groups
/// take 32 inputs a step (`step32`), others the 8-input steps.
fn main(s: &mut String, rb: usize, tb: usize, grouped: bool, packed: bool, wide: bool) {
    // At most 64 weights loaded ahead per invocation (registers).
    let unroll = if tb == 1 { (8 / rb).clamp(1, AHEAD) } else { 1 };
    let mut o = String::new();
    o.push_str(
        "\n@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let r0 = (wg.x + wg.y * prm.grid_x) * RB;
    if (r0 >= prm.rows) {
        return;
    }
",
    );
    o.push_str(if grouped {
        "    let it = items[prm.items0 + wg.z];
    wb = it.x;
    let t0 = it.w;
    let tokens = it.z;
    let x0 = prm.x0 + it.y * prm.in_dim;
    let y0 = prm.y0 + it.y * prm.out_stride;
"
    } else {
        "    wb = chunk_base();
    let t0 = wg.z * TB;
    let tokens = prm.tokens;
    let x0 = prm.x0;
    let y0 = prm.y0;
"
    });
    o.push_str("    setup();\n");
    o.push_str("    // Rows and tokens past the ends are computed on the last ones and never written.\n");
    for i in 0..rb {
        let _ = writeln!(o, "    let r_{i} = min(r0 + {i}u, prm.rows - 1u);");
        let _ = writeln!(o, "    let c_{i} = row_at(r_{i});");
    }
    for t in 0..tb {
        let _ = writeln!(
            o,
            "    let x_{t} = x0 + min(t0 + {t}u, tokens - 1u) * prm.in_dim;"
        );
    }
    for i in 0..rb {
        for t in 0..tb {
            let _ = writeln!(o, "    var a_{i}_{t} = 0.0;");
        }
    }
    o.push_str("    var g = l;\n");
    if wide {
        o.push_str("    let wide = wide32();\n    if (wide) {\n        let full32 = prm.in_dim / 32u;\n");
        o.push_str("        for (; g < full32; g = g + LANES) {\n");
        step32(&mut o, rb, tb);
        o.push_str("        }\n    }\n    if (!wide) {\n");
    }
    o.push_str("    let full = prm.in_dim / 8u;\n");
    if unroll > 1 {
        let _ = writeln!(
            o,
            "    for (; g + {}u < full; g = g + {}u) {{",
            64 * (unroll - 1),
            64 * unroll
        );
        step(&mut o, rb, tb, unroll, packed);
        o.push_str("    }\n");
    }
    o.push_str("    for (; g < full; g = g + LANES) {\n");
    step(&mut o, rb, tb, 1, packed);
    o.push_str("    }\n");
    // The last, partial group: invocation `full % 64` (the next in turn) takes it.
    o.push_str("    if (full * 8u < prm.in_dim && l == full % LANES) {\n");
    for i in 0..rb {
        for t in 0..tb {
            let _ = writeln!(
                o,
                "        for (var j = 8u * full; j < prm.in_dim; j = j + 1u) {{ a_{i}_{t} = fma(elem(r_{i}, j), xe(x_{t} + j), a_{i}_{t}); }}"
            );
        }
    }
    o.push_str("    }\n");
    if wide {
        o.push_str("    }\n");
    }
    for i in 0..rb {
        for t in 0..tb {
            let _ = writeln!(o, "    part[l][{}u] = a_{i}_{t};", i * tb + t);
        }
    }
    o.push_str(
        "    workgroupBarrier();
    // The fixed tree: at step s, sum l of output o takes sum l + s (l < s); the s x OUTS adds of
    // a step are spread over all 64 invocations, consecutive ones on consecutive outputs.
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        for (var i = l; i < s * OUTS; i = i + LANES) {
            let k = i / OUTS;
            let o = i % OUTS;
            part[k][o] = part[k][o] + part[k + s][o];
        }
        workgroupBarrier();
    }
    for (var o = l; o < OUTS; o = o + LANES) {
        let r = r0 + o / TB;
        let t = t0 + o % TB;
        if (r < prm.rows && t < tokens) {
            y[y0 + t * prm.out_stride + prm.row0 + r] = part[0][o];
        }
    }
}
",
    );
    s.push_str(&o);
}

/// One step of the group loop: `unroll` groups (g, g + 64, ...), their weights loaded first,
/// then each group's products in order; `packed`: `load8` gives a `Group8` of values and their
/// scale (`packed.wgsl`), else eight weights.
fn step(o: &mut String, rb: usize, tb: usize, unroll: usize, packed: bool) {
    for u in 0..unroll {
        let _ = writeln!(o, "        let k_{u} = 8u * (g + {}u);", 64 * u);
        for i in 0..rb {
            let _ = writeln!(o, "        let w_{i}_{u} = load8(c_{i}, r_{i}, k_{u});");
        }
    }
    for u in 0..unroll {
        for t in 0..tb {
            let _ = writeln!(o, "        let v_{t}_{u} = load_x8(x_{t} + k_{u});");
            for i in 0..rb {
                if packed {
                    let _ = writeln!(
                        o,
                        "        {{\n            var p = w_{i}_{u}.v[0] * v_{t}_{u}[0];"
                    );
                    for j in 1..8 {
                        let _ = writeln!(o, "            p = fma(w_{i}_{u}.v[{j}], v_{t}_{u}[{j}], p);");
                    }
                    let _ = writeln!(
                        o,
                        "            a_{i}_{t} = fma(p, w_{i}_{u}.s, a_{i}_{t});\n        }}"
                    );
                    continue;
                }
                for j in 0..8 {
                    let _ = writeln!(
                        o,
                        "        a_{i}_{t} = fma(w_{i}_{u}[{j}], v_{t}_{u}[{j}], a_{i}_{t});"
                    );
                }
            }
        }
    }
}

/// One step of the 32-input loop: each row's 16 bytes of codes and its scale loaded first; then
/// per 8 inputs each token's activations and each row's codes, every output's sum of the 32
/// codes times the inputs in input order; then each sum times its row's scale into the output's
/// sum. Activations come 8 at a time, so a tile of several tokens keeps few of them live.
fn step32(o: &mut String, rb: usize, tb: usize) {
    o.push_str("            let k = 32u * g;\n");
    for i in 0..rb {
        let _ = writeln!(o, "            let q_{i} = wvec(c_{i}, k);");
        let _ = writeln!(o, "            let s_{i} = scale_bf16(c_{i}, k);");
        for t in 0..tb {
            let _ = writeln!(o, "            var p_{i}_{t} = 0.0;");
        }
    }
    if tb > 1 {
        // Several tokens: the four eighths as a loop (the same sums in the same order), so the
        // step's code stays small enough for the registers.
        o.push_str("            for (var h = 0u; h < 4u; h = h + 1u) {\n");
        eighth(o, rb, tb, ("                ", ""), "8u * h", |i| {
            format!("q_{i}[h]")
        });
        o.push_str("            }\n");
    } else {
        for (h, lane) in ["x", "y", "z", "w"].iter().enumerate() {
            let names = ("            ", &*format!("_{h}"));
            eighth(o, rb, tb, names, &format!("{}u", 8 * h), |i| {
                format!("q_{i}.{lane}")
            });
        }
    }
    for i in 0..rb {
        for t in 0..tb {
            let _ = writeln!(o, "            a_{i}_{t} = fma(p_{i}_{t}, s_{i}, a_{i}_{t});");
        }
    }
}

/// Inputs `at`..`at` + 8 of a 32-input step: each token's activations, then each row's codes (the
/// word `word(row)`) times them into the outputs' sums; `(indent, suffix)`: the lines' indent and
/// the suffix of their names.
fn eighth(
    o: &mut String,
    rb: usize,
    tb: usize,
    (ind, sfx): (&str, &str),
    at: &str,
    word: impl Fn(usize) -> String,
) {
    for t in 0..tb {
        let _ = writeln!(o, "{ind}let v_{t}{sfx} = load_x8(x_{t} + k + {at});");
    }
    for i in 0..rb {
        let _ = writeln!(o, "{ind}let d_{i}{sfx} = codes8({});", word(i));
        for t in 0..tb {
            for j in 0..8 {
                let _ = writeln!(
                    o,
                    "{ind}p_{i}_{t} = fma(d_{i}{sfx}[{j}], v_{t}{sfx}[{j}], p_{i}_{t});"
                );
            }
        }
    }
}
