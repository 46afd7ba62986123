//! The module layering of the surface and the agent, checked on their source: each module
//! imports only modules of earlier layers (or its own submodules), so neither crate has an import
//! cycle (the surface's shared context and the agent's `AppState` are built from lower modules
//! only). ARCHITECTURE.md lists the same layers. No homeserver needed.

use std::collections::BTreeMap;
use std::path::Path;

/// The surface's modules, bottom to top. A module may import from any earlier layer.
const SURFACE: &[&[&str]] = &[
    &[
        "config",
        "decide",
        "filename",
        "health",
        "inbound",
        "journal",
        "lane_registry",
        "latency",
        "metrics",
        "mime",
        "purpose",
        "render",
        "retry",
        "route",
    ],
    &["connection", "event", "logging", "trust", "workspace"],
    &[
        "agent_link",
        "media",
        "members",
        "outbox",
        "retention",
        "session",
    ],
    &["waits"],
    &["context"],
    &["doctor", "send"],
    &["prompts"],
    &["lanes"],
    &["ingest", "mcp", "outbound"],
    &["undecrypted"],
    &["sync"],
];

/// The agent's modules, bottom to top.
const AGENT: &[&[&str]] = &[
    &[
        "config",
        "confine",
        "connection",
        "logging",
        "memory",
        "metrics",
        "store",
    ],
    &["speaker"],
    &["chat", "describe"],
    &["perceive"],
    &["link"],
    &["tools"],
    &["turn"],
    &["brain"],
    &["state"],
    &["session"],
    &["server"],
    &["doctor"],
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
fn surface_modules_import_only_lower_layers() {
    check("surface", SURFACE);
}

#[test]
fn agent_modules_import_only_lower_layers() {
    check("agent", AGENT);
}

fn check(krate: &str, layers: &[&[&str]]) {
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (*m, i)))
        .collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
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
    assert!(seen > 10, "the source walk found the modules of {krate}");
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
