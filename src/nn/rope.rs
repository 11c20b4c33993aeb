//! Rotary position embedding, the host-side half: frequency scaling (`rope_scaling` /
//! `rope_parameters`: linear, Llama 3, LongRoPE, YaRN, following Hugging Face's
//! `rope_init_fn`s),
//! the inverse frequencies, and the cos/sin table the GPU kernel reads.

/// Frequency scaling of the rotary embedding (`rope_scaling` / `rope_parameters`).
#[derive(Clone, Debug, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// LongRoPE (Phi-3): every frequency divided by its own factor, and cos/sin multiplied
    /// by `attention_factor`. transformers switches a sequence from the short factors to
    /// the long ones once it grows past `original_max_position_embeddings`, which a KV
    /// cache cannot follow without recomputing the sequence. pagellm picks one set for the
    /// whole context it serves ([`RopeScaling::for_context`]): the short factors up to the
    /// original length (transformers' numbers for every sequence), the long ones beyond
    /// (transformers' numbers for sequences longer than the original length).
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
        /// Use `long_factor`.
        long: bool,
    },
    /// YaRN (Peng et al. 2023; Qwen3, gpt-oss, DeepSeek): frequencies that turn fewer than
    /// `beta_slow` times over the original context are divided by `factor`, those that turn
    /// more than `beta_fast` times are kept, a linear ramp over the dimensions blends the
    /// ones between; cos and sin are multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        /// Round the ramp's ends outwards to whole dimensions (transformers' default).
        truncate: bool,
    },
}

impl RopeScaling {
    /// The scaling a context of `context` tokens uses: LongRoPE's long factors when the
    /// context exceeds the original one; anything else unchanged.
    pub fn for_context(&self, context: usize) -> RopeScaling {
        let mut s = self.clone();
        if let RopeScaling::LongRope {
            original_max_position_embeddings,
            long,
            ..
        } = &mut s
        {
            *long = context > *original_max_position_embeddings;
        }
        s
    }

    /// The factor cos and sin are multiplied by (1 except for LongRoPE).
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::LongRope {
                attention_factor, ..
            }
            | RopeScaling::Yarn {
                attention_factor, ..
            } => *attention_factor as f32,
            _ => 1.0,
        }
    }
}

/// The `head_dim / 2` inverse frequencies, in f32 as transformers computes them.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    if let RopeScaling::Yarn { .. } = scaling {
        return yarn_inv_freq(head_dim, theta, scaling);
    }
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let f = 1.0 / libm::powf(theta as f32, exponent);
            match *scaling {
                RopeScaling::None => f,
                RopeScaling::Linear { factor } => f / factor as f32,
                // transformers: 1 / (factor * theta^exponent), in f32.
                RopeScaling::LongRope {
                    ref short_factor,
                    ref long_factor,
                    long,
                    ..
                } => {
                    let factor = if long {
                        long_factor[i]
                    } else {
                        short_factor[i]
                    };
                    1.0 / (factor * libm::powf(theta as f32, exponent))
                }
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: old,
                } => {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let low_freq_wavelen = old / low_freq_factor;
                    let high_freq_wavelen = old / high_freq_factor;
                    let scaled = if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    };
                    scaled as f32
                }
                // Computed whole by `yarn_inv_freq`.
                RopeScaling::Yarn { .. } => f,
            }
        })
        .collect()
}

/// YaRN's inverse frequencies, as transformers computes them: the ramp's ends in f64, the
/// rest in f32.
fn yarn_inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        truncate,
        ..
    } = *scaling
    else {
        return Vec::new();
    };
    let dim = head_dim as f64;
    // The dimension at which a frequency turns `rotations` times over the original context.
    let dim_of = |rotations: f64| {
        dim * libm::log(original / (rotations * 2.0 * std::f64::consts::PI))
            / (2.0 * libm::log(theta))
    };
    let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
    if truncate {
        (low, high) = (libm::floor(low), libm::ceil(high));
    }
    let low = low.max(0.0);
    let mut high = high.min(dim - 1.0);
    if low == high {
        high += 0.001;
    }
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let pos_freq = libm::powf(theta as f32, exponent);
            let extrapolated = 1.0 / pos_freq;
            let interpolated = 1.0 / (factor as f32 * pos_freq);
            let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}

/// The table rope.wgsl reads: `[max_positions, head_dim]`, each row `cos` of the
/// `head_dim/2` angles then their `sin`, each times `attention_factor` (in f32, as
/// transformers scales them). Angles are f32 products as in transformers; the
/// trigonometry is done in f64, by the `libm` crate so that every platform (the browser's
/// included) builds the same table to the bit.
pub fn cos_sin_table(inv_freq: &[f32], max_positions: usize, attention_factor: f32) -> Vec<f32> {
    let half = inv_freq.len();
    let mut table = vec![0.0f32; max_positions * half * 2];
    for pos in 0..max_positions {
        let row = &mut table[pos * half * 2..(pos + 1) * half * 2];
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            row[i] = libm::cos(angle) as f32 * attention_factor;
            row[half + i] = libm::sin(angle) as f32 * attention_factor;
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN's frequencies against the paper's formula worked in f64: dimensions below the
    /// ramp keep their frequency, those above are divided by the factor, those on it blend
    /// linearly; the attention factor scales the table.
    #[test]
    fn yarn_blends_kept_and_divided_frequencies_along_its_ramp() {
        let (head_dim, theta, factor, original) = (32usize, 10000.0f64, 4.0f64, 64.0f64);
        let scaling = RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: 16.0,
            beta_slow: 1.0,
            attention_factor: 1.25,
            truncate: true,
        };
        let got = inv_freq(head_dim, theta, &scaling);
        // The ramp: from floor(d(16)) to ceil(d(1)), d(r) = dim ln(orig / (2 pi r)) / (2 ln theta).
        let d = |r: f64| {
            head_dim as f64 * (original / (r * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let (low, high) = (d(16.0).floor().max(0.0), d(1.0).ceil());
        assert_eq!((low, high), (0.0, 5.0));
        for (i, &g) in got.iter().enumerate() {
            let f = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = f / factor * ramp + f * (1.0 - ramp);
            assert!(
                ((g as f64) - want).abs() <= want * 1e-6,
                "dimension {i}: {g} against {want}"
            );
        }
        assert_eq!(got[0], 1.0, "the fastest frequency is kept exactly");
        let table = cos_sin_table(&got, 2, scaling.attention_factor());
        assert_eq!(table[0], 1.25, "cos(0) times the attention factor");
        // Without truncation the ramp ends at d(1) itself, unrounded.
        let loose = RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: 16.0,
            beta_slow: 1.0,
            attention_factor: 1.25,
            truncate: false,
        };
        let got = inv_freq(head_dim, theta, &loose);
        let (low, high) = (d(16.0).max(0.0), d(1.0));
        for (i, &g) in got.iter().enumerate() {
            let f = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = f / factor * ramp + f * (1.0 - ramp);
            assert!(((g as f64) - want).abs() <= want * 1e-6, "untruncated {i}");
        }
    }
}
