//! Bounded-time fuzzing (see `fuzzkit`) of the inbound file-name sanitizer, seeded with the
//! hostile name corpus `tests/corpus/filenames.json` (also sent through a real homeserver by
//! the e2e hostile suite).

use std::path::Path;

use surface::filename::{is_invisible_or_control, sanitize_filename};
use unicode_normalization::UnicodeNormalization;

/// Sanitizing is idempotent and never yields a separator, a hidden, option-like or blank name,
/// an invisible character, a name that is not NFC, or one over the limit; the result is always
/// a valid single workspace path component.
#[test]
fn fuzz_filename_sanitizer() {
    let seeds = fuzzkit::seed_strings(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/filenames.json"),
    );
    fuzzkit::run("filename_sanitizer", |u| {
        let name = fuzzkit::mutate_text(u, &seeds)?;
        // Every caller asks for at most a component's length.
        let max = u.int_in_range(0..=protocol::MAX_COMPONENT_BYTES)?;
        let out = sanitize_filename(&name, max);
        assert!(out.len() <= max.max(4), "{name:?} -> {out:?}");
        assert!(!out.contains(['/', '\\', '\0']), "{name:?} -> {out:?}");
        assert!(!out.starts_with(['.', '-', '~']), "{name:?} -> {out:?}");
        assert!(!out.chars().any(is_invisible_or_control), "{out:?}");
        assert!(
            out.chars().any(|c| !c.is_whitespace()),
            "blank: {name:?} -> {out:?}"
        );
        assert_eq!(out.nfc().collect::<String>(), out, "not NFC: {out:?}");
        assert!(
            protocol::WorkspacePath::new(out.as_str()).is_ok(),
            "{out:?}"
        );
        assert_eq!(out.split('/').count(), 1);
        assert_eq!(
            sanitize_filename(&out, max),
            out,
            "not idempotent: {name:?}"
        );
        Ok(())
    });
}
