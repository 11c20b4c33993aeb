//! Stop strings: ending generation when the output text contains one of the request's `stop`
//! strings, and keeping a possible beginning of one out of the stream.
//!
//! As in vLLM (with its default `include_stop_str_in_output = false`), the output is cut just
//! before the stop string; the stop string itself is not part of it. A stop string may arrive
//! split across several deltas, so each check looks for occurrences that end in the new text,
//! i.e. in the new text together with the `len - 1` bytes before it, never at the whole
//! output again. When one delta completes several stop strings, the one that ends first wins:
//! that is where a character-by-character stream would have stopped, so the output does not
//! depend on how the text was cut into deltas.
//!
//! While streaming, the end of the output may be the start of a stop string whose rest has not
//! been generated yet (`"Ob"` of `"Observation:"`). [`StopChecker::held_back_len`] says how many
//! trailing bytes that is; [`StopStream`] streams only what lies before them, and releases them
//! once it is clear they are ordinary text (or at the end of generation).

/// Where a stop string was found in the output text (byte offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopMatch {
    /// Index of the stop string in the list given to [`StopChecker::new`].
    pub stop_index: usize,
    /// Start of the stop string: the output is truncated to `text[..start]`.
    pub start: usize,
    /// End of the stop string (for callers that want to include it, unlike the default).
    pub end: usize,
}

/// The stop strings of one request. Stateless: works on the accumulated output text.
#[derive(Clone, Debug, Default)]
pub struct StopChecker {
    stops: Vec<String>,
}

impl StopChecker {
    /// Empty strings are ignored (they would match everywhere; request validation rejects
    /// them before this point).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        let stops: Vec<String> = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Self { stops }
    }

    /// The stop strings, in the order given (empty ones removed).
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Looks for a stop string that ends inside the last `new_len` bytes of `text` (the delta
    /// just appended). Returns the one that ends first, as a character-by-character stream
    /// would have met it first, so the result does not depend on how the text was cut into
    /// deltas; among those ending at the same place, the longest (earliest start), then the
    /// first in the list. `None` if there is none.
    pub fn check(&self, text: &str, new_len: usize) -> Option<StopMatch> {
        if new_len == 0 {
            return None;
        }
        let old_end = text.len().saturating_sub(new_len);
        let mut best: Option<StopMatch> = None;
        for (stop_index, stop) in self.stops.iter().enumerate() {
            // A match that ends in the new text starts at most `len - 1` bytes before it.
            let mut from = old_end.saturating_sub(stop.len() - 1);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(pos) = text[from..].find(stop.as_str()) {
                let start = from + pos;
                let m = StopMatch {
                    stop_index,
                    start,
                    end: start + stop.len(),
                };
                if best
                    .as_ref()
                    .is_none_or(|b| (m.end, m.start) < (b.end, b.start))
                {
                    best = Some(m);
                }
            }
        }
        best
    }

    /// Number of trailing bytes of `text` that form a proper prefix of some stop string and
    /// so must not be streamed yet. Always a character boundary of `text`.
    pub fn held_back_len(&self, text: &str) -> usize {
        let mut held = 0;
        for stop in &self.stops {
            // Longest first: the first hit for this stop string is its longest.
            let longest = (stop.len() - 1).min(text.len());
            for k in (held + 1..=longest).rev() {
                if stop.is_char_boundary(k) && text.ends_with(&stop[..k]) {
                    held = k;
                    break;
                }
            }
        }
        held
    }
}

/// What one [`StopStream::push`] produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopUpdate {
    /// Text that is now safe to show the client (may be empty).
    pub delta: String,
    /// Set when a stop string was found; generation should end. Offsets refer to the output
    /// text before truncation.
    pub stop: Option<StopMatch>,
}

/// The output text of one sequence, fed with detokenizer deltas: detects stop strings and
/// releases text for streaming only once it cannot be part of one.
#[derive(Clone, Debug, Default)]
pub struct StopStream {
    checker: StopChecker,
    text: String,
    /// Bytes of `text` already released.
    sent: usize,
    stopped: Option<StopMatch>,
}

impl StopStream {
    pub fn new(checker: StopChecker) -> Self {
        Self {
            checker,
            ..Self::default()
        }
    }

    /// Appends a delta. After a stop string has been found, further deltas are ignored.
    pub fn push(&mut self, delta: &str) -> StopUpdate {
        if self.stopped.is_some() {
            return StopUpdate::default();
        }
        self.text.push_str(delta);
        if let Some(m) = self.checker.check(&self.text, delta.len()) {
            self.text.truncate(m.start);
            let out = self.release(self.text.len());
            self.stopped = Some(m.clone());
            return StopUpdate {
                delta: out,
                stop: Some(m),
            };
        }
        let safe = self.text.len() - self.checker.held_back_len(&self.text);
        StopUpdate {
            delta: self.release(safe),
            stop: None,
        }
    }

    /// End of generation for another reason (EOS, length): releases the held-back tail.
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    /// The output so far, cut before the stop string if one was found (includes text still
    /// held back).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The stop string match, once found.
    pub fn stopped(&self) -> Option<&StopMatch> {
        self.stopped.as_ref()
    }

    fn release(&mut self, upto: usize) -> String {
        if upto <= self.sent {
            return String::new();
        }
        let out = self.text[self.sent..upto].to_string();
        self.sent = upto;
        out
    }
}
