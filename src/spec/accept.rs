//! Which proposed tokens the target model accepts.
//!
//! A speculating sequence contributes 1 + k query rows to a step: its last verified token
//! and the k proposed ones. Row `i`'s logits give the target's next-token distribution after
//! the verified tokens and proposals `0..i`; so row `i` judges proposal `i`, and the row after
//! the last accepted proposal supplies one more token for free. A step therefore emits
//! between 1 and k + 1 tokens: [`Accepted::accepted`] proposals, then [`Accepted::next`].
//!
//! - Greedy: proposals are kept while each equals the target's arg-max at its row; `next` is
//!   the arg-max of the first row that disagrees (or of the last row). The output is the
//!   non-speculative greedy output token for token.
//! - Sampled (speculative sampling, Leviathan et al. 2023, Chen et al. 2023): proposal `x`
//!   drawn from the draft's `q` is accepted with probability `min(1, p(x) / q(x))`; on the
//!   first rejection `next` is drawn from the residual `max(0, p - q)`, renormalized, and the
//!   rest are dropped. Each emitted token then has exactly the target's distribution `p`
//!   (given what precedes it), whatever `q` is. An n-gram proposal is a point mass
//!   (`q(x) = 1`): accepted with probability `p(x)`, and a rejection resamples from `p`
//!   without `x`.

use super::SpecError;
use crate::sampling::Distribution;
use rand::Rng;

/// A proposed token and the distribution it came from.
#[derive(Clone, Copy, Debug)]
pub enum Proposal<'a> {
    /// A token chosen without a distribution (prompt lookup): `q` is a point mass on it.
    Point(u32),
    /// A token drawn from a draft model's (filtered) distribution `q`. A token `q` gives no
    /// probability (it cannot have been drawn from it) is treated as a point mass.
    Drawn { token: u32, q: &'a Distribution },
}

impl Proposal<'_> {
    fn token(&self) -> u32 {
        match *self {
            Proposal::Point(t) | Proposal::Drawn { token: t, .. } => t,
        }
    }
}

/// The outcome of verifying one sequence's proposals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// How many proposals, from the first, were accepted.
    pub accepted: usize,
    /// The token the target emits after them: a correction or the bonus token.
    pub next: u32,
}

fn check_rows(proposed: usize, rows: usize) -> Result<(), SpecError> {
    if rows == proposed + 1 {
        Ok(())
    } else {
        Err(SpecError::Rows { proposed, rows })
    }
}

/// Greedy verification: `argmax[i]` is the target's arg-max at row `i` (one row more than
/// there are proposals).
pub fn accept_greedy(proposed: &[u32], argmax: &[u32]) -> Result<Accepted, SpecError> {
    check_rows(proposed.len(), argmax.len())?;
    let accepted = proposed
        .iter()
        .zip(argmax)
        .take_while(|(p, a)| p == a)
        .count();
    Ok(Accepted {
        accepted,
        next: argmax[accepted],
    })
}

/// Speculative sampling: `targets[i]` is the target's filtered distribution at row `i` (one
/// row more than there are proposals), `rng` the sequence's own generator. Draws one uniform
/// number per proposal examined, and one more for `next`.
pub fn accept_sampled(
    proposals: &[Proposal],
    targets: &[Distribution],
    rng: &mut impl Rng,
) -> Result<Accepted, SpecError> {
    check_rows(proposals.len(), targets.len())?;
    for (i, (prop, p)) in proposals.iter().zip(targets).enumerate() {
        let x = prop.token();
        let q = match *prop {
            Proposal::Drawn { q, .. } if q.prob(x) > 0.0 => Some(q),
            _ => None,
        };
        let (px, qx) = (p.prob(x), q.map_or(1.0, |q| q.prob(x)));
        let u: f64 = rng.random();
        // Accept with probability min(1, p(x) / q(x)).
        if u * qx < px {
            continue;
        }
        let residual: Vec<(u32, f64)> = p
            .entries()
            .iter()
            .map(|&(id, w)| {
                let qw = match q {
                    Some(q) => q.prob(id),
                    None => f64::from(u8::from(id == x)),
                };
                (id, w - qw)
            })
            .collect();
        // A rejection implies p(x) < q(x), so some other token has p > q; only rounding can
        // leave nothing, and then p itself is the right fallback.
        let next = match Distribution::from_weights(residual) {
            Some(r) => r.sample(rng),
            None => p.sample(rng),
        };
        return Ok(Accepted { accepted: i, next });
    }
    Ok(Accepted {
        accepted: proposals.len(),
        next: targets[proposals.len()].sample(rng),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::sequence_rng;

    fn dist(probs: &[f64]) -> Distribution {
        Distribution::from_weights(
            probs
                .iter()
                .enumerate()
                .map(|(i, &p)| (i as u32, p))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn greedy_keeps_the_agreeing_prefix_and_adds_the_targets_token() {
        let ok = |p: &[u32], a: &[u32]| accept_greedy(p, a).unwrap();
        assert_eq!(
            ok(&[5, 6, 7], &[5, 6, 7, 8]),
            Accepted {
                accepted: 3,
                next: 8
            }
        );
        assert_eq!(
            ok(&[5, 6, 7], &[5, 9, 7, 8]),
            Accepted {
                accepted: 1,
                next: 9
            }
        );
        assert_eq!(
            ok(&[5, 6, 7], &[4, 6, 7, 8]),
            Accepted {
                accepted: 0,
                next: 4
            }
        );
        assert_eq!(
            ok(&[], &[3]),
            Accepted {
                accepted: 0,
                next: 3
            }
        );
        assert_eq!(
            accept_greedy(&[1, 2], &[1, 2]),
            Err(SpecError::Rows {
                proposed: 2,
                rows: 2
            })
        );
    }

    #[test]
    fn certain_and_impossible_proposals() {
        let mut rng = sequence_rng(Some(1), 0);
        // The target puts all its mass on the proposals: all accepted, bonus from the last row.
        let sure = [dist(&[0.0, 1.0]), dist(&[1.0, 0.0]), dist(&[0.0, 0.0, 1.0])];
        let props = [Proposal::Point(1), Proposal::Point(0)];
        let got = accept_sampled(&props, &sure, &mut rng).unwrap();
        assert_eq!(
            got,
            Accepted {
                accepted: 2,
                next: 2
            }
        );
        // A proposal the target gives no probability is always rejected, and the correction
        // is never that token.
        for _ in 0..100 {
            let never = [dist(&[0.0, 0.5, 0.5]), dist(&[1.0])];
            let got = accept_sampled(&[Proposal::Point(0)], &never, &mut rng).unwrap();
            assert_eq!(got.accepted, 0);
            assert_ne!(got.next, 0);
        }
        // A draft equal to the target is always accepted.
        let p = dist(&[0.2, 0.3, 0.5]);
        for t in 0..3 {
            let props = [Proposal::Drawn { token: t, q: &p }];
            let got = accept_sampled(&props, &[p.clone(), p.clone()], &mut rng).unwrap();
            assert_eq!(got.accepted, 1);
        }
    }
}
