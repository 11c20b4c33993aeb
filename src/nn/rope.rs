//! Rotary position embedding, the host-side half: frequency scaling (`rope_scaling` /
//! `rope_parameters`: linear, Llama 3, LongRoPE, following Hugging Face's `rope_init_fn`s),
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
            } => *attention_factor as f32,
            _ => 1.0,
        }
    }
}

/// The `head_dim / 2` inverse frequencies, in f32 as transformers computes them.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
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
            }
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
