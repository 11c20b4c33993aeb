//! Prompt lookup: proposals copied from the sequence's own earlier tokens.
//!
//! Text that quotes, edits or summarizes its prompt repeats long runs of it; so does code
//! that renames a variable. For the last `n` tokens of a sequence (the longest `n` in
//! `min..=max` that has a match first), the most recent earlier occurrence of those `n`
//! tokens is found, and the tokens that followed it are proposed. The most recent match is
//! taken because repeats are local: the answer is likely continuing the passage it is
//! quoting now, not one it quoted earlier.
//!
//! [`NgramIndex`] keeps, for every `n`, a map from each n-gram to the end of its latest
//! occurrence, updated as tokens are appended, so a proposal costs `max - min + 1` hash
//! lookups however long the sequence is. Only verified tokens are appended: a rejected
//! proposal never enters the index.

use super::SpecError;
use std::collections::HashMap;

/// Per-sequence n-gram index over prompt and output tokens.
#[derive(Clone, Debug)]
pub struct NgramIndex {
    min: usize,
    max: usize,
    tokens: Vec<u32>,
    /// `latest[n - min]`: n-gram → end (exclusive) of its latest occurrence that is not the
    /// sequence's current tail, i.e. one with at least one token after it.
    latest: Vec<HashMap<Box<[u32]>, usize>>,
}

impl NgramIndex {
    /// An empty index matching n-grams of `min..=max` tokens.
    pub fn new(min: usize, max: usize) -> Result<Self, SpecError> {
        if min == 0 || min > max {
            return Err(SpecError::NgramRange { min, max });
        }
        Ok(NgramIndex {
            min,
            max,
            tokens: Vec::new(),
            latest: vec![HashMap::new(); max - min + 1],
        })
    }

    /// The tokens indexed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends verified tokens (the prompt at first, then each step's accepted ones).
    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            // The n-grams that end where `t` goes now have a token after them.
            let end = self.tokens.len();
            for n in self.min..=self.max.min(end) {
                let gram: Box<[u32]> = self.tokens[end - n..end].into();
                self.latest[n - self.min].insert(gram, end);
            }
            self.tokens.push(t);
        }
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the sequence's last
    /// `n` tokens, for the largest `n` with a match; empty when nothing matches.
    pub fn propose(&self, k: usize) -> Vec<u32> {
        let len = self.tokens.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min..=self.max.min(len)).rev() {
            let tail = &self.tokens[len - n..];
            if let Some(&end) = self.latest[n - self.min].get(tail) {
                return self.tokens[end..(end + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, by brute force: the largest n, then the latest earlier end.
    fn reference(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (min..=max.min(len)).rev() {
            let tail = &tokens[len - n..];
            for end in (n..len).rev() {
                if &tokens[end - n..end] == tail {
                    return tokens[end..(end + k).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }

    fn index(tokens: &[u32], min: usize, max: usize) -> NgramIndex {
        let mut ix = NgramIndex::new(min, max).unwrap();
        ix.extend(tokens);
        ix
    }

    #[test]
    fn a_quoted_passage_is_proposed_from_its_latest_occurrence() {
        // "the cat sat on the mat . the cat" → after "the cat", "sat on the".
        let t = [1, 2, 3, 4, 1, 5, 6, 1, 2];
        assert_eq!(index(&t, 1, 3).propose(3), vec![3, 4, 1]);
        // Only "1" matches at n = 1 when the tail is "6 1": the latest "1" was at 4,
        // followed by 5 6 1.
        let t = [1, 2, 3, 4, 1, 5, 6, 1];
        assert_eq!(index(&t, 1, 3).propose(3), vec![5, 6, 1]);
        // A longer match wins over a more recent shorter one: "7 8" occurs at 0..2 (then
        // 9), "8" alone most recently at 4 (then 0).
        let t = [7, 8, 9, 3, 8, 0, 7, 8];
        assert_eq!(index(&t, 1, 2).propose(2), vec![9, 3]);
        assert_eq!(index(&t, 1, 1).propose(2), vec![0, 7]);
        // The proposal stops at the end of the sequence.
        assert_eq!(index(&[5, 5], 1, 1).propose(4), vec![5]);
        // Nothing to match, or k = 0.
        assert!(index(&[1, 2, 3], 1, 2).propose(4).is_empty());
        assert!(index(&[1, 1, 1], 1, 2).propose(0).is_empty());
        assert!(index(&[], 1, 2).propose(3).is_empty());
    }

    #[test]
    fn impossible_ranges_are_refused() {
        assert_eq!(
            NgramIndex::new(0, 2).unwrap_err(),
            SpecError::NgramRange { min: 0, max: 2 }
        );
        assert!(NgramIndex::new(3, 2).is_err());
        assert!(NgramIndex::new(2, 2).is_ok());
    }

    proptest! {
        /// The index agrees with the brute-force definition after every appended chunk,
        /// over small alphabets (many repeats) and any n range.
        #[test]
        fn the_index_matches_brute_force(
            chunks in proptest::collection::vec(proptest::collection::vec(0u32..4, 0..6), 1..12),
            min in 1usize..4,
            extra in 0usize..3,
            k in 0usize..6,
        ) {
            let max = min + extra;
            let mut ix = NgramIndex::new(min, max).unwrap();
            let mut all = Vec::new();
            for c in &chunks {
                ix.extend(c);
                all.extend_from_slice(c);
                prop_assert_eq!(ix.propose(k), reference(&all, min, max, k));
            }
            prop_assert_eq!(ix.tokens(), &all[..]);
        }
    }
}
