//! Helpers shared by the benches (each bench includes this file as a module).

use pagellm::internals::engine::Engine;
use std::time::{Duration, Instant};

/// Steps every engine in turn, one step each per round, until all are done, so that the
/// configurations compared see the same machine conditions; `times[i]` gets engine `i`'s
/// step durations after its first `skip` steps (the prefill).
#[allow(dead_code)] // not every bench that includes this file keeps a fixed order
pub fn alternate_steps(engines: &mut [Engine], skip: usize, times: &mut [Vec<Duration>]) {
    alternate_steps_in(engines, skip, times, None);
}

/// [`alternate_steps`] with the engines' order drawn anew each round (seeded), so that no
/// engine always steps right after the same other one: on a CPU adapter a step runs a
/// little slower after a heavy step of another engine (caches, the driver's threads), which
/// in a fixed order always falls on the same engine.
#[allow(dead_code)] // not every bench that includes this file shuffles
pub fn alternate_steps_shuffled(
    engines: &mut [Engine],
    skip: usize,
    times: &mut [Vec<Duration>],
    seed: u64,
) {
    alternate_steps_in(engines, skip, times, Some(seed));
}

fn alternate_steps_in(
    engines: &mut [Engine],
    skip: usize,
    times: &mut [Vec<Duration>],
    seed: Option<u64>,
) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.unwrap_or(0));
    let mut order: Vec<usize> = (0..engines.len()).collect();
    let mut step = 0;
    while engines.iter().any(|e| e.has_unfinished()) {
        if seed.is_some() {
            order.shuffle(&mut rng);
        }
        for &i in &order {
            let (e, t) = (&mut engines[i], &mut times[i]);
            if !e.has_unfinished() {
                continue;
            }
            let start = Instant::now();
            e.step().expect("step");
            if step >= skip {
                t.push(start.elapsed());
            }
        }
        step += 1;
    }
}
