//! Integration tests of the confined opener against a real filesystem under attack.

// Helpers outside `#[test]` functions fail tests by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod known;
mod race;
