//! Per-sequence random number generators.
//!
//! Every sequence owns its RNG, so the tokens it draws depend only on its request's seed and
//! its sample index, never on which other sequences share the batch, in what order they are
//! sampled, or whether it was preempted and resumed (vLLM keeps a per-request generator for
//! the same reason).
//!
//! Scheme: the request seed becomes the ChaCha key (`seed_from_u64`), and the sample index
//! (0..n) selects the ChaCha stream. Streams of one key are independent 2^64-block sequences,
//! so the `n` samples of a request are as unrelated as if seeded separately, yet each one is
//! reproducible alone. ChaCha8 is plenty for sampling and costs little per draw.
//! Without a seed the key comes from the thread RNG (itself seeded by the operating system).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The RNG type one sequence samples with.
pub type SequenceRng = ChaCha8Rng;

/// The RNG of sample `sample_index` of a request with `seed` (fresh entropy if `None`).
pub fn sequence_rng(seed: Option<u64>, sample_index: u64) -> SequenceRng {
    match seed {
        Some(seed) => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(sample_index);
            rng
        }
        None => ChaCha8Rng::from_rng(&mut rand::rng()),
    }
}
