//! The surface's own latency, from its log: `DEBUG` lines of the tracing target
//! `mxbridge_latency` with the fields `leg` (`sync_to_agent`, `agent_to_send`) and `us`
//! (microseconds). Pure parsing.

use std::collections::BTreeMap;

/// The tracing target the surface logs its latency under.
pub const TARGET: &str = "mxbridge_latency";

/// Every sample in `log`, per leg, in milliseconds, in log order. Tolerates quoted and bare
/// values (`leg="x"` / `leg=x`) and colour codes.
pub fn samples(log: &str) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains(TARGET)) {
        let line = strip_ansi(line);
        let (Some(leg), Some(us)) = (field(&line, "leg"), field(&line, "us")) else {
            continue;
        };
        if let Ok(us) = us.parse::<f64>() {
            out.entry(leg.to_owned()).or_default().push(us / 1000.0);
        }
    }
    out
}

/// How long the surface's upload of the file named `name` took, in seconds: the `us` field of
/// its `file uploaded` (or `file uploaded encrypted`) line whose span names the file.
pub fn upload_secs(log: &str, name: &str) -> Option<f64> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("file uploaded") && l.contains(name))
        .find_map(|l| field(&l, "us")?.parse::<f64>().ok())
        .map(|us| us / 1e6)
}

/// The value of `name=value` (value optionally in double quotes) among whitespace-separated
/// fields.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|tok| {
        let v = tok.strip_prefix(name)?.strip_prefix('=')?;
        Some(v.trim_matches('"').trim_end_matches(','))
    })
}

/// `line` without ANSI colour sequences (`ESC [ … letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_bare_and_coloured_lines() {
        let log = "\
2025-01-01T00:00:00.000001Z DEBUG mxbridge_latency: leg=\"sync_to_agent\" us=1500
2025-01-01T00:00:00.000002Z DEBUG handle{room=!r:hs}: mxbridge_latency: leg=agent_to_send us=250
2025-01-01T00:00:00.000003Z  INFO surface::sync: leg=sync_to_agent us=99999 not ours
\u{1b}[2m2025-01-01T00:00:00Z\u{1b}[0m \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[2mmxbridge_latency\u{1b}[0m\u{1b}[2m:\u{1b}[0m \u{1b}[3mleg\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"sync_to_agent\" \u{1b}[3mus\u{1b}[0m\u{1b}[2m=\u{1b}[0m500
2025-01-01T00:00:00.000004Z DEBUG mxbridge_latency: leg=sync_to_agent us=oops
2025-01-01T00:00:00.000005Z DEBUG mxbridge_latency: no fields here
";
        let s = samples(log);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s["sync_to_agent"], vec![1.5, 0.5]);
        assert_eq!(s["agent_to_send"], vec![0.25]);
        assert!(samples("nothing\n").is_empty());
    }

    #[test]
    fn upload_times_are_found_by_file_name() {
        let log = "\
2025-01-01T00:00:00Z  INFO upload_file{path=chats/c/out-a.bin size=9}: surface::media::upload: file uploaded mxc=mxc://h/a us=1500000
2025-01-01T00:00:01Z  INFO upload_file_encrypted{path=chats/c/out-b.bin size=9}: surface::media::upload: file uploaded encrypted mxc=mxc://h/b us=250
2025-01-01T00:00:02Z  INFO attachment downloaded path=inbox/out-c.bin us=7
";
        assert_eq!(upload_secs(log, "out-a.bin"), Some(1.5));
        assert_eq!(upload_secs(log, "out-b.bin"), Some(0.000_25));
        assert_eq!(upload_secs(log, "out-c.bin"), None);
        assert_eq!(upload_secs(log, "out-d.bin"), None);
    }
}
