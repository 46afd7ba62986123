//! The surface's module layering, checked on its source: each module imports only modules of
//! earlier layers (or its own submodules), so there is no import cycle and the shared context is
//! built from lower modules only. ARCHITECTURE.md lists the same layers.

use std::collections::BTreeMap;
use std::path::Path;

/// Bottom to top. A module may import from any earlier layer.
const LAYERS: &[&[&str]] = &[
    &[
        "config",
        "decide",
        "event",
        "filename",
        "health",
        "journal",
        "lane_registry",
        "logging",
        "mime",
        "render",
        "retry",
    ],
    &["connection", "trust", "workspace"],
    &["agent_link", "media", "outbox", "retention", "session"],
    &["waits"],
    &["context"],
    &["send"],
    &["lanes"],
    &["ingest", "outbound"],
    &["undecrypted"],
    &["sync"],
];

/// `crate::<module>` names a file's code mentions (comments and doc links aside).
fn imports(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let text = code.as_str();
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

#[test]
fn modules_import_only_lower_layers() {
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (*m, i)))
        .collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in walk(&src) {
        let rel = entry
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        // The top module a file belongs to: `lanes/turn.rs` is part of `lanes`.
        let top = rel.split(['/', '.']).next().unwrap().to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&mine) = layer_of.get(top.as_str()) else {
            problems.push(format!("{rel}: module `{top}` is in no layer"));
            continue;
        };
        seen += 1;
        let text = std::fs::read_to_string(&entry).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for m in imports(code) {
            if m == top {
                continue;
            }
            match layer_of.get(m.as_str()) {
                Some(&l) if l < mine => {}
                Some(&l) => {
                    problems.push(format!("{rel} (layer {mine}) imports `{m}` (layer {l})"))
                }
                None => problems.push(format!("{rel} imports `{m}`, which is in no layer")),
            }
        }
    }
    assert!(seen > 20, "the source walk found the modules");
    assert!(problems.is_empty(), "{problems:#?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}
