//! Helpers shared by the benches (each bench includes this file as a module).

use pagellm::engine::Engine;
use std::time::{Duration, Instant};

/// Steps every engine in turn, one step each per round, until all are done, so that the
/// configurations compared see the same machine conditions; `times[i]` gets engine `i`'s
/// step durations after its first `skip` steps (the prefill).
pub fn alternate_steps(engines: &mut [Engine], skip: usize, times: &mut [Vec<Duration>]) {
    let mut step = 0;
    while engines.iter().any(|e| e.has_unfinished()) {
        for (e, t) in engines.iter_mut().zip(times.iter_mut()) {
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
