//! Rotary position embeddings: plain (NeoX rotate-half, Llama/Qwen/Mixtral) and interleaved
//! pairs (DeepSeek MLA), with YaRN frequency scaling as transformers implements it.

use strata_formats::JsonConfig;

use crate::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotates x[i] with x[i + dim/2] (rotate_half).
    NeoX,
    /// Rotates the pair (x[2i], x[2i+1]). transformers de-interleaves q and k before a NeoX
    /// rotation; both get the same permutation, so every q.k score is the same as here.
    Interleaved,
}

#[derive(Clone, Debug)]
pub struct Rope {
    pub dim: usize,
    pub inv_freq: Vec<f32>,
    /// YaRN's `attention_factor`, multiplied into cos and sin.
    pub attention_factor: f32,
    pub style: RopeStyle,
}

/// YaRN's magnitude correction `0.1 * mscale * ln(scale) + 1` (1 when scale <= 1).
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl Rope {
    pub fn plain(dim: usize, theta: f64, style: RopeStyle) -> Rope {
        Rope {
            dim,
            inv_freq: base_inv_freq(dim, theta),
            attention_factor: 1.0,
            style,
        }
    }

    /// Reads `rope_theta` and `rope_scaling` (none, `yarn`, `llama3`, `linear`, or the frequency
    /// factors of a GGUF file's `rope_freqs` tensor) for a rotary slice of `dim`.
    pub fn from_config(cfg: &JsonConfig, dim: usize, default_theta: f64, style: RopeStyle) -> Result<Rope> {
        let theta = cfg.opt_f64("rope_theta")?.unwrap_or(default_theta);
        let Some(scaling) = cfg.opt_object("rope_scaling")? else {
            return Ok(Rope::plain(dim, theta, style));
        };
        let kind = scaling
            .opt_str("type")?
            .or(scaling.opt_str("rope_type")?)
            .unwrap_or("default")
            .to_string();
        match kind.as_str() {
            "default" => Ok(Rope::plain(dim, theta, style)),
            "yarn" => {
                let factor = scaling.f64("factor")?;
                let orig = match scaling.opt_usize("original_max_position_embeddings")? {
                    Some(v) => v,
                    None => cfg.usize("max_position_embeddings")?,
                } as f64;
                let beta_fast = scaling.opt_f64("beta_fast")?.unwrap_or(32.0);
                let beta_slow = scaling.opt_f64("beta_slow")?.unwrap_or(1.0);
                let mscale = scaling.opt_f64("mscale")?.unwrap_or(0.0);
                let mscale_all_dim = scaling.opt_f64("mscale_all_dim")?.unwrap_or(0.0);
                let attention_factor = match scaling.opt_f64("attention_factor")? {
                    Some(a) => a,
                    None if mscale != 0.0 && mscale_all_dim != 0.0 => {
                        yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                    }
                    None => yarn_mscale(factor, 1.0),
                };
                Ok(Rope {
                    dim,
                    inv_freq: yarn_inv_freq(dim, theta, factor, orig, beta_fast, beta_slow),
                    attention_factor: attention_factor as f32,
                    style,
                })
            }
            "llama3" => {
                let factor = scaling.f64("factor")?;
                let low = scaling.f64("low_freq_factor")?;
                let high = scaling.f64("high_freq_factor")?;
                let orig = scaling.f64("original_max_position_embeddings")?;
                if high <= low {
                    return Err(crate::ModelError::BadConfig {
                        path: cfg.path.display().to_string(),
                        reason: format!(
                            "rope_scaling: high_freq_factor {high} must exceed low_freq_factor {low}"
                        ),
                    });
                }
                let inv_freq = llama3_inv_freq(&base_inv_freq(dim, theta), factor, low, high, orig);
                Ok(Rope {
                    inv_freq,
                    ..Rope::plain(dim, theta, style)
                })
            }
            "linear" => {
                let factor = scaling.f64("factor")? as f32;
                let inv_freq = base_inv_freq(dim, theta).iter().map(|f| f / factor).collect();
                Ok(Rope {
                    inv_freq,
                    ..Rope::plain(dim, theta, style)
                })
            }
            "freq_factors" => {
                let factors: Vec<f64> = (scaling.get("factors").and_then(|v| v.as_array()))
                    .map(|a| a.iter().filter_map(|f| f.as_f64()).collect())
                    .unwrap_or_default();
                if factors.len() != dim / 2 {
                    return Err(crate::ModelError::BadConfig {
                        path: cfg.path.display().to_string(),
                        reason: format!(
                            "rope frequency factors: {} for a rotary dimension of {dim}",
                            factors.len()
                        ),
                    });
                }
                let inv_freq = (base_inv_freq(dim, theta).iter().zip(&factors))
                    .map(|(f, k)| f / *k as f32)
                    .collect();
                Ok(Rope {
                    inv_freq,
                    ..Rope::plain(dim, theta, style)
                })
            }
            other => Err(crate::ModelError::BadConfig {
                path: cfg.path.display().to_string(),
                reason: format!(
                    "rope_scaling type `{other}` is not supported (supported: yarn, llama3, linear)"
                ),
            }),
        }
    }

    /// (cos, sin) for one position, each of dim/2 (attention factor applied).
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        self.inv_freq
            .iter()
            .map(|f| {
                let a = p * f;
                (a.cos() * self.attention_factor, a.sin() * self.attention_factor)
            })
            .unzip()
    }

    /// Rotates every `dim`-wide slice of `x` (one per head) that starts at `offset` within each
    /// row of `stride`.
    pub fn apply(&self, x: &mut [f32], stride: usize, offset: usize, cos: &[f32], sin: &[f32]) {
        let half = self.dim / 2;
        for head in x.chunks_exact_mut(stride) {
            let s = &mut head[offset..offset + self.dim];
            match self.style {
                RopeStyle::NeoX => {
                    for i in 0..half {
                        let (a, b) = (s[i], s[i + half]);
                        s[i] = a * cos[i] - b * sin[i];
                        s[i + half] = b * cos[i] + a * sin[i];
                    }
                }
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (s[2 * i], s[2 * i + 1]);
                        s[2 * i] = a * cos[i] - b * sin[i];
                        s[2 * i + 1] = b * cos[i] + a * sin[i];
                    }
                }
            }
        }
    }
}

impl RopeStyle {
    /// NeoX (rotating the two halves, as Hugging Face checkpoints store q and k), or
    /// adjacent pairs where the config says `rope_interleaved` (a GGUF file's Llama-style q and k,
    /// whose rows llama.cpp's converter permutes).
    pub fn of(cfg: &JsonConfig) -> Result<RopeStyle> {
        Ok(if cfg.opt_bool("rope_interleaved")?.unwrap_or(false) {
            RopeStyle::Interleaved
        } else {
            RopeStyle::NeoX
        })
    }
}

fn base_inv_freq(dim: usize, theta: f64) -> Vec<f32> {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
    (0..dim / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// Llama 3's frequencies, as transformers computes them (in f32): wavelengths longer than
/// `orig / low` are slowed by `factor`, shorter than `orig / high` kept, and those between
/// blended.
fn llama3_inv_freq(base: &[f32], factor: f64, low: f64, high: f64, orig: f64) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = ((orig / low) as f32, (orig / high) as f32);
    let factor = factor as f32;
    base.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            let scaled = if wavelen > low_wavelen { f / factor } else { f };
            if wavelen < high_wavelen || wavelen > low_wavelen {
                return scaled;
            }
            let smooth = (orig as f32 / wavelen - low as f32) / (high - low) as f32;
            (1.0 - smooth) * scaled / factor + smooth * scaled
        })
        .collect()
}

fn yarn_inv_freq(dim: usize, theta: f64, factor: f64, orig: f64, beta_fast: f64, beta_slow: f64) -> Vec<f32> {
    let correction_dim = |rotations: f64| {
        dim as f64 * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
    };
    let low = correction_dim(beta_fast).floor().max(0.0);
    let high = correction_dim(beta_slow).ceil().min(dim as f64 - 1.0);
    let high = if high == low { high + 0.001 } else { high };
    let pos_freqs: Vec<f32> = (0..dim / 2)
        .map(|i| (theta as f32).powf((2 * i) as f32 / dim as f32))
        .collect();
    (0..dim / 2)
        .map(|i| {
            let extrapolation = 1.0 / pos_freqs[i];
            let interpolation = 1.0 / (factor as f32 * pos_freqs[i]);
            let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
            // inv_freq_extrapolation_factor = 1 - ramp
            interpolation * ramp + extrapolation * (1.0 - ramp)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_mscale_matches_the_documented_example() {
        // deepseek-v3-tiny: 48^-0.5 * m(4, 1)^2 = 0.18711 in the fixtures README (m rounded to 1.1386)
        let m = yarn_mscale(4.0, 1.0);
        assert!((48f64.powf(-0.5) * m * m - 0.18711).abs() < 5e-5);
    }

    #[test]
    fn rotation_preserves_norm_and_pairs() {
        let rope = Rope::plain(8, 10000.0, RopeStyle::Interleaved);
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let n0: f32 = x.iter().map(|v| v * v).sum();
        let (c, s) = rope.cos_sin(5);
        rope.apply(&mut x, 8, 0, &c, &s);
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    fn config(scaling: serde_json::Value) -> JsonConfig {
        let value = serde_json::json!({"rope_theta": 500000.0, "rope_scaling": scaling});
        JsonConfig::parse(std::path::Path::new("config.json"), &value.to_string()).unwrap()
    }

    #[test]
    fn llama3_slows_long_wavelengths_keeps_short_ones_and_blends_between() {
        let dim = 64;
        let scaling = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        let rope = Rope::from_config(&config(scaling), dim, 1e4, RopeStyle::NeoX).unwrap();
        let base = base_inv_freq(dim, 500000.0);
        let wavelen = |f: f32| 2.0 * std::f32::consts::PI / f;
        let mut blended = 0;
        for (got, f) in rope.inv_freq.iter().zip(&base) {
            match wavelen(*f) {
                w if w < 16.0 => assert_eq!(got, f),
                w if w > 64.0 => assert_eq!(*got, f / 8.0),
                _ => {
                    blended += 1;
                    assert!(*got < *f && *got > f / 8.0, "{got} between {f} / 8 and {f}");
                }
            }
        }
        assert!(blended > 0, "no frequency in the blended band");
        // The same scaling as a GGUF file's divisors (llama.cpp's converter, in f64).
        let factors: Vec<f64> = (base.iter())
            .map(|&f| {
                let w = 2.0 * std::f64::consts::PI / f as f64;
                if w < 16.0 {
                    1.0
                } else if w > 64.0 {
                    8.0
                } else {
                    let smooth = (64.0 / w - 1.0) / 3.0;
                    1.0 / ((1.0 - smooth) / 8.0 + smooth)
                }
            })
            .collect();
        let scaling = serde_json::json!({"rope_type": "freq_factors", "factors": factors});
        let from_gguf = Rope::from_config(&config(scaling), dim, 1e4, RopeStyle::NeoX).unwrap();
        for (a, b) in from_gguf.inv_freq.iter().zip(&rope.inv_freq) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "{a} against {b}");
        }
        let short = serde_json::json!({"rope_type": "freq_factors", "factors": [1.0, 2.0]});
        let e = Rope::from_config(&config(short), dim, 1e4, RopeStyle::NeoX).unwrap_err();
        assert!(e.to_string().contains("2 for a rotary dimension of 64"), "{e}");
    }
}
