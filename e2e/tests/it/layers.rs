//! The module layering of the surface and the agent, checked on their source: each module
//! imports only modules of earlier layers (or its own submodules), so neither crate has an import
//! cycle (the surface's shared context and the agent's `AppState` are built from lower modules
//! only). ARCHITECTURE.md lists the same layers. Inside a module tree, the submodules of one
//! module import each other without a circle either (`store/lines.rs` and `store/log.rs` may not
//! both use the other). No homeserver needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The surface's modules, bottom to top. A module may import from any earlier layer.
const SURFACE: &[&[&str]] = &[
    &["command"],
    &[
        "capabilities",
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
        "room_settings",
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
    &["announce", "delayed", "prompts"],
    &["lanes"],
    &["ingest", "mcp", "outbound"],
    &["undecrypted"],
    &["sync"],
];

/// The agent's modules, bottom to top.
const AGENT: &[&[&str]] = &[
    &["metrics"],
    &["db"],
    &[
        "config",
        "confine",
        "connection",
        "lease",
        "logging",
        "memory",
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
    &["doctor", "import"],
];

/// A file's code: before its tests, without comments and doc links.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::<module>` names a file's code mentions (comments and doc links aside).
fn imports(text: &str) -> Vec<String> {
    let code = code(text);
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

#[test]
fn surface_module_trees_have_no_import_circles() {
    let circles = circles(&source("surface"));
    assert!(circles.is_empty(), "{circles:#?}");
}

#[test]
fn agent_module_trees_have_no_import_circles() {
    let circles = circles(&source("agent"));
    assert!(circles.is_empty(), "{circles:#?}");
}

fn source(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

fn check(krate: &str, layers: &[&[&str]]) {
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (*m, i)))
        .collect();
    let src = source(krate);
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
        for m in imports(&text) {
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

/// A module by its path below the crate root (`["tools", "mcp", "hub"]`).
type ModPath = Vec<String>;

/// The circles among sibling submodules below `src`, each as `a -> b -> … -> a`: module `a`
/// (a file or a folder of them) uses `b` through `super::`, `self::` or `crate::` paths, and so
/// on back to `a`. Modules of the crate's top level are the layers' business.
fn circles(src: &Path) -> Vec<String> {
    let files: BTreeMap<ModPath, PathBuf> = walk(src)
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap().with_extension("");
            let path: ModPath = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            (path, f)
        })
        .filter(|(path, _)| path != &["lib"] && path != &["main"])
        .collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, file) in &files {
        let code = code(&std::fs::read_to_string(file).unwrap());
        for target in references(module, &code, &files) {
            // The siblings below the two modules' deepest common ancestor.
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= 1 && common < module.len() && common < target.len() {
                let from = module[..=common].to_vec();
                edges
                    .entry(from)
                    .or_default()
                    .insert(target[..=common].to_vec());
            }
        }
    }
    let mut found = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            if let Some(back) = route(&edges, to, from) {
                let names: Vec<String> = std::iter::once(from)
                    .chain(&back)
                    .map(|m| m.join("::"))
                    .collect();
                found.push(names.join(" -> "));
            }
        }
    }
    found
}

/// The modules `code` of `module` names through `crate::`, `super::` or `self::` paths (one
/// level of `{…}` groups read), each the longest prefix of the path that is a module.
fn references(module: &ModPath, code: &str, files: &BTreeMap<ModPath, PathBuf>) -> Vec<ModPath> {
    let mut out = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(head) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base: ModPath = match head {
                "crate::" => Vec::new(),
                "super::" => module[..module.len() - 1].to_vec(),
                _ => module.clone(),
            };
            for rest in paths(&code[i + head.len()..]) {
                let mut at = base.clone();
                let mut segments = rest.iter().peekable();
                while segments.peek().is_some_and(|s| *s == "super") {
                    at.pop();
                    segments.next();
                }
                let mut found = at.clone();
                for segment in segments {
                    at.push(segment.clone());
                    if !files.contains_key(&at) {
                        break;
                    }
                    found = at.clone();
                }
                out.push(found);
            }
        }
    }
    out
}

/// The paths a `use` or an expression continues with after `crate::`: `a::b` gives one,
/// `a::{b, c::d}` gives `a::b` and `a::c::d`.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            return group
                .split(',')
                .map(|item| {
                    let mut path = prefix.clone();
                    path.extend(item.trim().split("::").map(|s| s.trim().to_owned()));
                    path
                })
                .collect();
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[name.len()..];
        if !name.is_empty() {
            prefix.push(name);
        }
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![prefix],
        }
    }
}

/// A way from `from` to `to` along `edges` (the modules after `from`, `to` last).
fn route(
    edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
    from: &ModPath,
    to: &ModPath,
) -> Option<Vec<ModPath>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.clone()]];
    while let Some(way) = stack.pop() {
        let last = way.last().unwrap();
        if last == to {
            return Some(way);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for next in edges.get(last).into_iter().flatten() {
            let mut longer = way.clone();
            longer.push(next.clone());
            stack.push(longer);
        }
    }
    None
}

#[test]
fn circles_are_found_in_a_module_tree() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("store.rs", "mod lines;\nmod log;\nuse lines::*;\n");
    write("store/lines.rs", "use super::log::TurnSlot;\n");
    write("store/log.rs", "use super::{lines::*, Store};\n");
    write("tools.rs", "mod mcp;\n");
    write("tools/mcp.rs", "mod client;\nmod hub;\n");
    write(
        "tools/mcp/hub.rs",
        "fn f() { crate::tools::mcp::client::connect() }\n",
    );
    write("tools/mcp/client.rs", "mod stdio;\n");
    write(
        "tools/mcp/client/stdio.rs",
        "use super::super::hub::shown;\n",
    );
    write(
        "lone.rs",
        "// use crate::store::log;\nuse crate::tools::mcp::hub;\n",
    );
    assert_eq!(
        circles(dir.path()),
        [
            "store::lines -> store::log -> store::lines",
            "store::log -> store::lines -> store::log",
            "tools::mcp::client -> tools::mcp::hub -> tools::mcp::client",
            "tools::mcp::hub -> tools::mcp::client -> tools::mcp::hub",
        ]
    );
}
