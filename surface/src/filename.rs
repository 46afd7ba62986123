//! Turns a name a Matrix user chose into a safe, readable file name for the workspace.
//!
//! `sanitize-filename` removes path separators, reserved punctuation and C0/C1 controls. This
//! wrapper adds what it misses: NFC normalization, Unicode format characters (bidi overrides
//! such as U+202E that make `gnp.exe` render as `exe.png`, zero-width characters), leading
//! `.`/`-`/`~` (hidden files, option injection, home expansion), characters that render as
//! nothing (Hangul fillers, the braille blank), empty results, Windows-reserved
//! device names (escaped instead of replaced, so the name stays readable), and a byte cap that
//! keeps the extension.

use unicode_normalization::UnicodeNormalization;

/// Name used when nothing usable is left of the original.
pub const FALLBACK_NAME: &str = "file";

/// Longest extension (after the last `.`, in bytes) that truncation tries to keep.
const MAX_KEPT_EXTENSION: usize = 16;

/// Returns a safe single-component file name for `name`, at most `max_bytes` bytes long.
///
/// The result is never empty, never `.`/`..`, never hidden (no leading `.`), never starts with
/// `-` or `~`, contains no `/`, `\`, NUL, control or format characters, is not a Windows device
/// name, and is NFC-normalized. When it has to be shortened, the extension (up to 16 bytes)
/// is kept and the cut happens at a character boundary. `max_bytes` below 4 is treated as 4
/// so that the fallback `file` always fits.
pub fn sanitize_filename(name: &str, max_bytes: usize) -> String {
    let max_bytes = max_bytes.max(FALLBACK_NAME.len());
    // Filter first: removing a zero-width character can leave a decomposed pair behind.
    let cleaned: String = name
        .chars()
        .filter(|c| !is_invisible_or_control(*c))
        .nfc()
        .collect();
    let cleaned = sanitize_filename::sanitize_with_options(
        // Trimmed before as well: the crate turns `..` into `_`, we prefer the fallback name.
        trim(&cleaned),
        sanitize_filename::Options {
            // Device names are escaped below instead; trailing dots and spaces are trimmed.
            windows: false,
            truncate: false,
            replacement: "_",
        },
    );
    let mut out = trim(&cleaned).to_owned();
    if out.is_empty() {
        return FALLBACK_NAME.to_owned();
    }
    if out.len() > max_bytes {
        out = trim(&truncate_keeping_extension(&out, max_bytes)).to_owned();
        if out.is_empty() {
            return FALLBACK_NAME.to_owned();
        }
    }
    // After truncation, which can turn `CONSOLE` into `CON`. The escaped name starts with `_`,
    // so cutting it again cannot make it reserved.
    if is_windows_reserved(&out) {
        out.insert(0, '_');
        if out.len() > max_bytes {
            out = trim(&truncate_keeping_extension(&out, max_bytes)).to_owned();
        }
    }
    out
}

/// Chooses the file name and caption of a Matrix media event.
///
/// Matrix rule (spec v1.10 media captions): when `filename` is present and differs from
/// `body`, `body` is a caption and `filename` the name; otherwise `body` is the name. The name
/// is returned as sent: pass it through [`sanitize_filename`] before touching the filesystem.
pub fn pick_name(filename: Option<&str>, body: &str) -> (String, Option<String>) {
    match filename {
        Some(f) if !f.trim().is_empty() && f != body => {
            let caption = (!body.trim().is_empty()).then(|| body.to_owned());
            (f.to_owned(), caption)
        }
        _ => (body.to_owned(), None),
    }
}

/// Strips what must not start or end a name: leading `.`, `-`, `~` and whitespace, trailing
/// dots and whitespace (Windows drops those silently, and `name.` is confusing anyway).
fn trim(s: &str) -> &str {
    s.trim_start_matches(|c: char| matches!(c, '.' | '-' | '~') || c.is_whitespace())
        .trim_end_matches(|c: char| c == '.' || c.is_whitespace())
}

/// Windows device names, alone or followed by an extension (`CON`, `con.txt`, `LPT1.tar.gz`).
fn is_windows_reserved(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or(name).trim_end();
    let upper = stem.to_ascii_uppercase();
    match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => {
            let mut chars = upper.chars();
            let last = chars.next_back();
            matches!(chars.as_str(), "COM" | "LPT")
                && last.is_some_and(|c| {
                    c.is_ascii_digit() || matches!(c, '\u{b9}' | '\u{b2}' | '\u{b3}')
                })
        }
    }
}

/// Cuts `name` to at most `max` bytes, keeping a short extension when there is one.
fn truncate_keeping_extension(name: &str, max: usize) -> String {
    let ext = name
        .rfind('.')
        .filter(|&dot| dot > 0 && name.len() - dot <= MAX_KEPT_EXTENSION + 1)
        .map(|dot| &name[dot..]);
    match ext {
        Some(ext) if ext.len() < max => {
            let stem = &name[..name.len() - ext.len()];
            format!("{}{ext}", cut_at_boundary(stem, max - ext.len()))
        }
        _ => cut_at_boundary(name, max).to_owned(),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
fn cut_at_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Control characters (Cc), line/paragraph separators (Zl, Zp), format characters (Cf),
/// which include the bidi overrides and isolates and zero-width characters, and the letters
/// and marks that render as nothing (so a name of them looks blank).
pub fn is_invisible_or_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}')
        || is_format_char(c)
        || is_blank_filler(c)
}

/// Characters that are letters or marks by category but show nothing: the Hangul fillers,
/// the braille blank, the combining grapheme joiner, Khmer inherent vowels and Mongolian
/// variation selectors.
fn is_blank_filler(c: char) -> bool {
    matches!(
        c as u32,
        0x034F | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B
            ..=0x180D | 0x180F | 0x2800 | 0x3164 | 0xFFA0
    )
}

/// Unicode general category Cf (Unicode 15.1).
fn is_format_char(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn hostile_names_table() {
        let long_stem = format!("{}.pdf", "a".repeat(296));
        let long_expected = format!("{}.pdf", "a".repeat(196));
        let long_multibyte = format!("{}.txt", "é".repeat(150));
        let multibyte_expected = format!("{}.txt", "é".repeat(98));
        let cases: &[(&str, &str)] = &[
            ("report.pdf", "report.pdf"),
            ("../../etc/passwd", "_.._etc_passwd"),
            ("..", "file"),
            (".", "file"),
            ("...", "file"),
            ("\u{202e}gnp.exe", "gnp.exe"),
            ("photo\u{202e}gpj.exe", "photogpj.exe"),
            ("a\u{2066}b\u{2069}c\u{200b}d\u{feff}.txt", "abcd.txt"),
            ("CON.txt", "_CON.txt"),
            ("con", "_con"),
            ("nul.tar.gz", "_nul.tar.gz"),
            ("COM1", "_COM1"),
            ("lpt9.log", "_lpt9.log"),
            ("COMPUTER.txt", "COMPUTER.txt"),
            ("console.log", "console.log"),
            (".bashrc", "bashrc"),
            ("-rf", "rf"),
            ("--help.txt", "help.txt"),
            ("~root", "root"),
            ("a/b\\c", "a_b_c"),
            ("", "file"),
            ("   ", "file"),
            ("\0", "file"),
            ("a\0b", "ab"),
            ("line\nbreak.txt", "linebreak.txt"),
            ("trailing. . ", "trailing"),
            ("what?.txt", "what_.txt"),
            ("e\u{301}t\u{e9}.txt", "\u{e9}t\u{e9}.txt"),
            ("名前.txt", "名前.txt"),
            // Names that render blank.
            ("\u{3164}", "file"),
            (" \u{115f}\u{2800} ", "file"),
            ("\u{ffa0}.png", "png"),
            (&long_stem, &long_expected),
            (&long_multibyte, &multibyte_expected),
        ];
        for (input, expected) in cases {
            assert_eq!(sanitize_filename(input, 200), *expected, "input {input:?}");
        }
    }

    #[test]
    fn truncation_without_usable_extension() {
        let name = format!("{}.{}", "a".repeat(50), "x".repeat(40));
        let out = sanitize_filename(&name, 30);
        assert_eq!(out, "a".repeat(30));
        assert_eq!(sanitize_filename("abcdef", 2), "abcd");
        assert_eq!(sanitize_filename("abcdefgh.txt", 6), "ab.txt");
    }

    #[test]
    fn pick_name_follows_matrix_caption_rule() {
        let cases: &[(Option<&str>, &str, &str, Option<&str>)] = &[
            (None, "photo.jpg", "photo.jpg", None),
            (Some("photo.jpg"), "photo.jpg", "photo.jpg", None),
            (
                Some("photo.jpg"),
                "look at this",
                "photo.jpg",
                Some("look at this"),
            ),
            (Some(""), "photo.jpg", "photo.jpg", None),
            (Some("photo.jpg"), "", "photo.jpg", None),
        ];
        for (filename, body, name, caption) in cases {
            let (n, c) = pick_name(*filename, body);
            assert_eq!(n, *name, "{filename:?} {body:?}");
            assert_eq!(c.as_deref(), *caption, "{filename:?} {body:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn always_safe(name in any::<String>(), max in 0usize..=protocol::MAX_COMPONENT_BYTES) {
            let out = sanitize_filename(&name, max);
            prop_assert!(!out.is_empty());
            prop_assert!(out.len() <= max.max(4), "{} > {}", out.len(), max);
            prop_assert!(!out.starts_with(['.', '-', '~']));
            prop_assert!(!out.contains(['/', '\\', '\0']));
            prop_assert!(!out.chars().any(is_invisible_or_control), "{out:?}");
            prop_assert!(!is_windows_reserved(&out));
            prop_assert!(protocol::WorkspacePath::new(out.clone()).is_ok());
            // Idempotent: sanitizing again changes nothing.
            prop_assert_eq!(sanitize_filename(&out, max), out);
        }
    }
}
