//! Bounded-time fuzzing that runs inside the test command (no nightly toolchain, no separate
//! runner): each target is an [`arbtest`] property given a time budget, fed by a committed
//! seed corpus and random mutations of it. A failure prints the seed that reproduces it
//! (`ARBTEST_SEED=…`).
//!
//! The budget per target is `MXBRIDGE_FUZZ_MS` milliseconds (default [`DEFAULT_BUDGET_MS`]).
//!
//! A dev-dependency only. The targets: the wire decoder, `WorkspacePath` and the id names
//! (`protocol/tests/it/fuzz.rs`), the inbound file-name sanitizer (`surface/tests/it/fuzz.rs`),
//! admission against the real chat store (`agent/tests/it/fuzz.rs`), and PDF text through the
//! real helper process and its limits (`agent/tests/it/pdf.rs`, seeds in
//! `agent/tests/corpus/pdf/`, made by its `generate.py`).

use std::path::Path;
use std::time::Instant;

pub use arbtest::arbitrary::{self, Result, Unstructured};

/// Milliseconds each target runs unless `MXBRIDGE_FUZZ_MS` says otherwise.
pub const DEFAULT_BUDGET_MS: u64 = 8_000;

/// Pieces that break naive path, name and id handling, spliced into seeds by the mutators:
/// separators, dot segments, encodings of them, NUL and other controls, bidi and invisible
/// characters, combining marks (NFC/NFD twins), reserved names, long runs.
pub const HOSTILE_TOKENS: &[&str] = &[
    "/",
    "\\",
    "\0",
    ".",
    "..",
    "../",
    "%2e%2e%2f",
    "%2F",
    "%00",
    "~",
    "-",
    " ",
    "\t",
    "\n",
    "\r",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{200b}",
    "\u{200d}",
    "\u{200e}",
    "\u{202e}",
    "\u{2066}",
    "\u{2028}",
    "\u{feff}",
    "\u{fffd}",
    "\u{301}",
    "e\u{301}",
    "\u{e9}",
    "\u{ff0f}",
    "\u{2215}",
    "CON",
    "nul",
    "LPT1",
    ":",
    "!",
    "@",
    "%",
    "\u{1f600}",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

/// The budget per target in milliseconds.
pub fn budget_ms() -> u64 {
    std::env::var("MXBRIDGE_FUZZ_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_BUDGET_MS)
}

/// Runs `property` for the budget and prints how many cases it tried. Panics (failing the
/// test) when the property does, with the reproducing seed.
pub fn run<P>(target: &str, mut property: P)
where
    P: FnMut(&mut Unstructured<'_>) -> Result<()>,
{
    let started = Instant::now();
    let mut cases = 0u64;
    arbtest::arbtest(|u| {
        cases += 1;
        property(u)
    })
    .budget_ms(budget_ms())
    .size_max(4096)
    .run();
    // A report line next to the test's name, like the other suites' figures.
    #[allow(clippy::print_stdout)]
    {
        println!(
            "fuzz {target}: cases={cases} ms={}",
            started.elapsed().as_millis()
        );
    }
}

/// The files of a seed folder, sorted by name. Panics when it is missing or empty: a fuzz
/// target without its committed corpus is a broken test.
pub fn seed_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    let seeds: Vec<Vec<u8>> = entries
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!seeds.is_empty(), "empty seed corpus {}", dir.display());
    seeds
}

/// A JSON file holding an array of strings (names, paths, ids). Panics when it is missing,
/// malformed or empty.
pub fn seed_strings(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", file.display()));
    let seeds: Vec<String> = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", file.display()));
    assert!(!seeds.is_empty(), "empty seed corpus {}", file.display());
    seeds
}

/// A seed picked by `u`, edited one to five times: bytes flipped, inserted, deleted,
/// duplicated, or spliced in from another seed or from [`HOSTILE_TOKENS`].
pub fn mutate_bytes(u: &mut Unstructured<'_>, seeds: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut b = u.choose(seeds)?.clone();
    for _ in 0..u.int_in_range(1..=5)? {
        let at = if b.is_empty() {
            0
        } else {
            u.choose_index(b.len() + 1)?
        };
        let len = u.int_in_range(0..=16usize)?;
        let end = (at + len).min(b.len());
        match u.int_in_range(0..=5u8)? {
            0 if at < b.len() => b[at] ^= u.arbitrary::<u8>()?.max(1),
            1 => b.insert(at, u.arbitrary()?),
            2 => drop(b.drain(at..end)),
            3 => {
                let span = b[at..end].to_vec();
                b.splice(at..at, span);
            }
            4 => {
                let other = u.choose(seeds)?;
                let from = u.choose_index(other.len() + 1)?;
                let to = (from + len).min(other.len());
                b.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                let token = u.choose(HOSTILE_TOKENS)?.as_bytes();
                b.splice(at..at, token.iter().copied());
            }
        }
    }
    Ok(b)
}

/// Like [`mutate_bytes`] on text, cutting and inserting at character boundaries so the
/// result stays a `String`; sometimes a fresh arbitrary string instead.
pub fn mutate_text(u: &mut Unstructured<'_>, seeds: &[String]) -> Result<String> {
    if u.ratio(1, 8)? {
        return u.arbitrary();
    }
    let mut chars: Vec<char> = u.choose(seeds)?.chars().collect();
    for _ in 0..u.int_in_range(1..=5)? {
        let at = if chars.is_empty() {
            0
        } else {
            u.choose_index(chars.len() + 1)?
        };
        let len = u.int_in_range(0..=16usize)?;
        let end = (at + len).min(chars.len());
        match u.int_in_range(0..=4u8)? {
            0 => chars.insert(at, u.arbitrary()?),
            1 => drop(chars.drain(at..end)),
            2 => {
                let span = chars[at..end].to_vec();
                chars.splice(at..at, span);
            }
            3 => {
                let other: Vec<char> = u.choose(seeds)?.chars().collect();
                let from = u.choose_index(other.len() + 1)?;
                let to = (from + len).min(other.len());
                chars.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                let token = u.choose(HOSTILE_TOKENS)?;
                chars.splice(at..at, token.chars());
            }
        }
    }
    Ok(chars.into_iter().collect())
}
