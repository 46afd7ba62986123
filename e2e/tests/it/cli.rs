//! Both binaries explain themselves the same way: `--help` lists every setting with its
//! variable and default (compared with the committed snapshots in `tests/it/snapshots/`;
//! `MXBRIDGE_BLESS=1` rewrites them), `--version` names the version, and a configuration
//! problem (from the environment or a `--config` file) is one `<bin>: configuration: …` line
//! on stderr and exit code 2, before anything binds or logs in. No homeserver needed.

use std::path::Path;
use std::process::{Command, Output};

use e2e::procs::bin;

fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin(name))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run the binary")
}

#[test]
fn help_matches_the_snapshots_and_version_is_printed() {
    for name in ["surface", "agent"] {
        let out = run(name, &["--help"], &[]);
        assert!(out.status.success(), "{name} --help: {out:?}");
        let help = String::from_utf8(out.stdout).unwrap();
        let snapshot = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/it/snapshots")
            .join(format!("{name}-help.txt"));
        if std::env::var_os("MXBRIDGE_BLESS").is_some() {
            std::fs::write(&snapshot, &help).unwrap();
        }
        let expected = std::fs::read_to_string(&snapshot).unwrap_or_default();
        assert!(
            help == expected,
            "{name} --help changed; if intended, rerun with MXBRIDGE_BLESS=1 and commit \
             {}:\n{help}",
            snapshot.display()
        );
        let out = run(name, &["--version"], &[]);
        let version = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            version.trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn configuration_problems_are_one_line_and_exit_code_2_in_both() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "AGENT_TOKN = \"x\"\nAGENT_BIND = [1]\n").unwrap();
    let file = file.to_str().unwrap();
    // (binary, arguments, environment, what the line names)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        ("agent", &[], &[], "AGENT_TOKEN"),
        ("surface", &[], &[], "MATRIX_HOMESERVER_URL"),
        (
            "agent",
            &["--config", file],
            &[],
            "unknown setting `AGENT_TOKN`",
        ),
        (
            "surface",
            &["--config", file],
            &[],
            "unknown setting `AGENT_TOKN`",
        ),
        (
            "agent",
            &["--agent-bind", "nonsense"],
            &[
                ("AGENT_TOKEN", "0123456789abcdef"),
                ("AGENT_BIND", "127.0.0.1:1"),
            ],
            "AGENT_BIND",
        ),
    ];
    for (name, args, env, says) in cases {
        let out = run(name, args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {stderr}");
        let line = stderr.lines().next().unwrap_or_default();
        assert!(
            line.starts_with(&format!("{name}: configuration: ")) && line.contains(says),
            "{name} {args:?}: {stderr}"
        );
    }
    // Both problems of the file, at once.
    let out = run("agent", &["--config", file], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`AGENT_BIND` must be"), "{stderr}");
}

/// A database out of reach at start is a setting that does not work: one line on stderr naming
/// `AGENT_DATABASE_URL` (never its password) and exit code 2; with `AGENT_DATABASE_WAIT` the
/// agent says it waits, keeps trying, and then ends the same way.
#[test]
fn a_database_out_of_reach_at_start_is_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let url = format!("postgres://mxbridge:hunter2-pw@127.0.0.1:{port}/mx?sslmode=disable");
    let root = dir.path().to_str().unwrap();
    // The agent on the database `url`, waiting for it `wait`.
    let agent_on = |url: &str, wait: &str| {
        run(
            "agent",
            &[],
            &[
                ("AGENT_TOKEN", "0123456789abcdef"),
                ("AGENT_BIND", "127.0.0.1:0"),
                ("WORKSPACE_ROOT", root),
                ("AGENT_STATE_DIR", root),
                ("AGENT_DATABASE_URL", url),
                ("AGENT_DATABASE_WAIT", wait),
            ],
        )
    };
    for wait in ["0s", "2s"] {
        let out = agent_on(&url, wait);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(2), "{wait}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("agent: AGENT_DATABASE_URL: PostgreSQL"),
            "{wait}: {stderr}"
        );
        assert!(
            !format!("{stdout}{stderr}").contains("hunter2"),
            "{stdout}{stderr}"
        );
        assert_eq!(
            stdout.contains("waiting for it"),
            wait != "0s",
            "{wait}: {stdout}"
        );
        assert!(lines[0].contains("Connection refused"), "{stderr}");
    }
    // A wrong password, on the test command's PostgreSQL: the server's refusal, not the password.
    let Ok(admin) = std::env::var("MXBRIDGE_TEST_DATABASE_URL") else {
        return;
    };
    let (user, rest) = admin.split_once('@').unwrap();
    let user = user.rsplit_once(':').unwrap().0;
    let wrong = format!("{user}:wrong-hunter2@{rest}");
    let out = agent_on(&wrong, "0s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.lines().count() == 1 && stderr.contains("28P01") && !stderr.contains("hunter2"),
        "{stderr}"
    );
}

/// The settings cannot drift apart: every variable either binary's `--help` lists is documented
/// in `.env.example`, and every setting `.env.example` assigns (`NAME=` or `#NAME=`) that a
/// binary reads is passed through by `compose.yaml`; where the README's settings table or
/// `compose.yaml` (`${NAME:-x}`) gives a default, it is the one `--help` shows. (Test-only
/// switches are not in `--help`.)
#[test]
fn help_env_example_readme_and_compose_agree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let env_example = std::fs::read_to_string(root.join(".env.example")).unwrap();
    let compose = std::fs::read_to_string(root.join("compose.yaml")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    // `NAME` → default, as `--help` shows them.
    let mut defaults: Vec<(String, String)> = Vec::new();
    let mentions = |text: &str, name: &str| {
        text.match_indices(name).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !word(before) && !word(after)
        })
    };
    let mut read = Vec::new();
    for name in ["surface", "agent"] {
        let out = run(name, &["--help"], &[]);
        let help = String::from_utf8(out.stdout).unwrap();
        for option in help.split("[env: ").skip(1) {
            let Some((var, rest)) = option.split_once(']') else {
                continue;
            };
            if let Some(default) = rest
                .split_once("[default: ")
                .and_then(|(_, d)| d.split_once(']'))
                .map(|(d, _)| d)
            {
                defaults.push((var.to_owned(), default.to_owned()));
            }
        }
        let options = help
            .split("[env: ")
            .skip(1)
            .filter_map(|rest| rest.split(']').next());
        // The secrets section lists `  NAME  what it is`.
        let secrets = help
            .split_once("Secrets")
            .map(|(_, s)| s)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.len() > 3 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
        read.extend(options.chain(secrets).map(str::to_owned));
    }
    assert!(
        read.len() > 40,
        "the variables were found in --help: {read:?}"
    );
    let undocumented: Vec<&String> = read.iter().filter(|v| !mentions(&env_example, v)).collect();
    assert!(
        undocumented.is_empty(),
        ".env.example does not document {undocumented:?}"
    );
    let assigned = env_example.lines().filter_map(|l| {
        let l = l.trim_start_matches('#').trim_start();
        let (name, _) = l.split_once('=')?;
        (!name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .then_some(name)
    });
    let dropped: Vec<&str> = assigned
        .filter(|n| read.iter().any(|v| v == n) && !mentions(&compose, n))
        .collect();
    assert!(
        dropped.is_empty(),
        "compose.yaml does not pass {dropped:?}, which .env.example documents"
    );

    // The README's settings table: a row naming `VAR` shows its default in backticks.
    let mut wrong = Vec::new();
    for row in readme.lines().filter(|l| l.starts_with("| `")) {
        let Some((names, rest)) = row[1..].split_once('|') else {
            continue;
        };
        let shown: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
        let plain = rest.replace('`', "");
        for (var, default) in &defaults {
            let named = names.split('`').skip(1).step_by(2).any(|n| n == var);
            let says =
                shown.iter().any(|s| s.contains(default.as_str())) || mentions(&plain, default);
            if named && !default.is_empty() && !says {
                wrong.push(format!("{var} (default {default}): {row}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "README rows that do not show the real default:\n{}",
        wrong.join("\n")
    );
    // compose.yaml's fallbacks are the binaries' defaults (or say why not, on the line above).
    let mut differ = Vec::new();
    let lines: Vec<&str> = compose.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        for (var, default) in &defaults {
            let Some(fallback) = line
                .split_once(&format!("${{{var}:-"))
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(f, _)| f)
            else {
                continue;
            };
            let explained = i > 0 && lines[i - 1].contains("not the default");
            if fallback != default && !explained {
                differ.push(format!("{var}: compose {fallback:?}, --help {default:?}"));
            }
        }
    }
    assert!(
        differ.is_empty(),
        "compose.yaml falls back to other defaults than the binaries: {differ:?}"
    );
}
