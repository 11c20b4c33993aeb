//! Stop strings: truncation before the stop string (vLLM's default), stop strings split across
//! deltas, hold-back of a possible stop-string prefix while streaming, and a property test
//! that streaming in random pieces gives the same output as cutting the whole text at once.

use pagellm::internals::tokenizer::{StopChecker, StopMatch, StopStream};
use proptest::prelude::*;

#[test]
fn stop_in_one_delta_truncates_before_it() {
    let checker = StopChecker::new(["\n\n"]);
    let text = "first line\n\nsecond";
    let m = checker.check(text, text.len()).unwrap();
    assert_eq!(
        m,
        StopMatch {
            stop_index: 0,
            start: 10,
            end: 12
        }
    );
    assert_eq!(&text[..m.start], "first line");
}

#[test]
fn stop_spanning_two_deltas_is_found() {
    let checker = StopChecker::new(["Observation:"]);
    let mut text = String::from("Thought: look it up. Obser");
    assert_eq!(checker.check(&text, text.len()), None);
    text.push_str("vation: 42");
    let m = checker.check(&text, "vation: 42".len()).unwrap();
    assert_eq!(&text[..m.start], "Thought: look it up. ");
}

#[test]
fn only_the_new_region_is_searched() {
    // A stop string entirely inside old text was handled when it arrived; the window looks
    // only `longest stop - 1` bytes back.
    let checker = StopChecker::new(["ab"]);
    assert_eq!(checker.check("ab......x", 1), None);
    assert!(checker.check("......ab", 1).is_some());
    assert_eq!(checker.check("ab", 0), None);
}

#[test]
fn first_ending_match_wins_then_longest_then_list_order() {
    // "lo" ends first, although "llo w" starts earlier.
    let checker = StopChecker::new(["world", "llo w", "lo"]);
    let m = checker.check("hello world", 11).unwrap();
    assert_eq!((m.stop_index, m.start, m.end), (2, 3, 5));
    // "ab" ends before "abc": a stream that got "ab" first would have stopped there.
    let checker = StopChecker::new(["abc", "ab"]);
    let m = checker.check("xabcx", 5).unwrap();
    assert_eq!((m.stop_index, m.start, m.end), (1, 1, 3));
    // Same end: the longer one (earlier start) wins; then list order.
    let checker = StopChecker::new(["bc", "abc", "abc"]);
    let m = checker.check("xabcx", 5).unwrap();
    assert_eq!((m.stop_index, m.start, m.end), (1, 1, 4));
}

#[test]
fn result_does_not_depend_on_delta_boundaries() {
    // Stops "aba" and "b" in " aba": " ab" completes "b" first, whatever the cut.
    let checker = StopChecker::new(["aba", "b"]);
    assert_eq!(checker.check(" aba", 4).unwrap().start, 2);
    assert_eq!(checker.check(" ab", 3).unwrap().start, 2);
}

#[test]
fn multibyte_stop_strings_and_window_boundaries() {
    let checker = StopChecker::new(["日本"]);
    // The window start falls inside a multi-byte character and must be moved to a boundary.
    // (11 bytes, new 3, longest stop 6: the window would start at byte 3, inside é.)
    let text = "aaé日本";
    let m = checker.check(text, "本".len()).unwrap();
    assert_eq!(&text[..m.start], "aaé");
    assert_eq!(checker.held_back_len("abc日"), "日".len());
    assert_eq!(checker.held_back_len("abc本"), 0);
}

#[test]
fn held_back_len_is_the_longest_stop_prefix_at_the_end() {
    let checker = StopChecker::new(["Observation:", "END"]);
    assert_eq!(checker.held_back_len("text Ob"), 2);
    assert_eq!(
        checker.held_back_len("text Observation"),
        "Observation".len()
    );
    assert_eq!(checker.held_back_len("text EN"), 2);
    assert_eq!(checker.held_back_len("text E"), 1);
    assert_eq!(checker.held_back_len("text"), 0);
    // A complete stop string is a match, not a hold-back.
    assert_eq!(checker.held_back_len("text END"), 0);
    // Shorter text than the prefix.
    assert_eq!(StopChecker::new(["abcdef"]).held_back_len("ab"), 2);
    assert_eq!(
        StopChecker::new(Vec::<String>::new()).held_back_len("abc"),
        0
    );
}

#[test]
fn empty_stop_strings_are_ignored() {
    let checker = StopChecker::new(["", "x"]);
    assert_eq!(checker.stops(), ["x"]);
    assert!(StopChecker::new([""]).is_empty());
}

#[test]
fn stream_never_shows_a_stop_prefix() {
    let mut stream = StopStream::new(StopChecker::new(["Observation:"]));
    let mut shown = String::new();
    let input = "Hello Obs world. Observation: secret";
    for c in input.chars() {
        let update = stream.push(&c.to_string());
        shown.push_str(&update.delta);
        assert!(!shown.contains("Observ"), "leaked {shown:?}");
        if update.stop.is_some() {
            break;
        }
    }
    assert_eq!(shown, "Hello Obs world. ");
    assert_eq!(stream.text(), "Hello Obs world. ");
    assert_eq!(stream.stopped().map(|m| m.stop_index), Some(0));
    // Further deltas after the stop are ignored.
    assert_eq!(stream.push("more").delta, "");
    assert_eq!(stream.finish(), "");
}

#[test]
fn stream_releases_a_false_alarm() {
    let mut stream = StopStream::new(StopChecker::new(["Observation:"]));
    assert_eq!(stream.push("abc O").delta, "abc ");
    assert_eq!(stream.push("b").delta, "");
    assert_eq!(stream.push("x").delta, "Obx");
    assert_eq!(stream.push(" Obs").delta, " ");
    // Generation ends for another reason: the held tail was ordinary text.
    assert_eq!(stream.finish(), "Obs");
    assert_eq!(stream.text(), "abc Obx Obs");
}

#[test]
fn stream_without_stops_passes_everything_through() {
    let mut stream = StopStream::new(StopChecker::default());
    assert_eq!(stream.push("a").delta, "a");
    assert_eq!(stream.push("bc").delta, "bc");
    assert_eq!(stream.finish(), "");
}

proptest! {
    /// Streaming a text in arbitrary pieces shows exactly the text cut before the first stop
    /// string occurrence, and never shows a prefix of a stop string that then completes.
    #[test]
    fn streaming_in_pieces_equals_cutting_at_once(
        text in "[ab ]{0,30}",
        cuts in prop::collection::vec(0usize..31, 0..8),
        stops in prop::collection::vec("[ab]{1,3}", 1..3),
    ) {
        let checker = StopChecker::new(stops.clone());
        // Where a character-by-character stream stops: the stop string that ends first (the
        // longest of those ending there).
        let expected = stops
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|pos| (pos + s.len(), pos)))
            .min()
            .map_or(text.as_str(), |(_, pos)| &text[..pos]);

        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        let mut stream = StopStream::new(checker);
        let mut shown = String::new();
        let mut stopped = false;
        for w in bounds.windows(2) {
            let update = stream.push(&text[w[0]..w[1]]);
            shown.push_str(&update.delta);
            prop_assert!(expected.starts_with(&shown), "shown {:?}, expected {:?}", shown, expected);
            if update.stop.is_some() {
                stopped = true;
                break;
            }
        }
        if !stopped {
            shown.push_str(&stream.finish());
        }
        prop_assert_eq!(stopped, expected.len() < text.len());
        prop_assert_eq!(shown.as_str(), expected);
        prop_assert_eq!(stream.text(), expected);
    }
}
