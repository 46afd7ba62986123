//! The command line both binaries share, on `clap`: `--help` lists every setting with its
//! environment variable and default, `--version`, `--config FILE` (a TOML file whose keys are
//! the variable names), and one lookup the typed configurations read through: a command-line
//! flag wins over the environment, which wins over the file.
//!
//! The typed configurations (`surface::config`, `agent::config`) stay the one place that parses
//! and validates values; this crate only finds them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};

/// The clap this crate builds on, for binaries that add subcommands with their own arguments.
pub use clap;

/// One setting: its environment variable, default (as the help shows it) and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    /// The environment variable, e.g. `MATRIX_HOMESERVER_URL`; the flag is its kebab-case
    /// (`--matrix-homeserver-url`), the file key the name itself.
    pub name: &'static str,
    /// The default, as shown in `--help` (`""`: required or unset).
    pub default: &'static str,
    /// One line.
    pub help: &'static str,
    /// A secret: environment or file only, never a flag (other users see flags in `ps`).
    pub secret: bool,
    /// For the test suite only: read like any other, but not listed in `--help`.
    pub hidden: bool,
}

impl Var {
    /// A setting (`default` as `--help` shows it; `""`: none).
    pub const fn new(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            name,
            default,
            help,
            secret: false,
            hidden: false,
        }
    }

    /// A switch for the test suite: it works, but `--help` does not offer it to operators.
    pub const fn test_only(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            name,
            default,
            help,
            secret: false,
            hidden: true,
        }
    }

    /// A secret setting: environment or file only.
    pub const fn secret(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            default: "",
            help,
            secret: true,
            hidden: false,
        }
    }
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Run the program with these settings.
    Run(Lookup),
    /// Run the named subcommand (e.g. `doctor`) with these settings.
    Sub(String, Lookup),
}

/// The settings found: flags, then the environment, then the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    flags: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    file: BTreeMap<String, String>,
    args: BTreeMap<String, String>,
}

impl Lookup {
    /// The value of `name`, if any source has one.
    pub fn get(&self, name: &str) -> Option<String> {
        self.flags
            .get(name)
            .or_else(|| self.env.get(name))
            .or_else(|| self.file.get(name))
            .cloned()
    }

    /// The value of the subcommand's own argument `id` (e.g. `doctor --room`), if given.
    pub fn arg(&self, id: &str) -> Option<&str> {
        self.args.get(id).map(String::as_str)
    }
}

/// Why the command line or the file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--help`, `--version` or a usage error: clap's text, printed as clap prints it.
    #[error("{0}")]
    Clap(#[from] clap::Error),
    /// The configuration file cannot be read.
    #[error("--config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A secret's `<NAME>_FILE` cannot be read.
    #[error("{var}_FILE {path}: {source}")]
    SecretFile {
        /// The secret's variable.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML, or has keys no setting has.
    #[error("--config {path}: {problems}")]
    File {
        /// The file.
        path: PathBuf,
        /// Every problem, `; `-separated.
        problems: String,
    },
}

const PRECEDENCE: &str = "Every setting can also come from its environment variable or from the \
                          TOML file given with --config (keys are the variable names); a flag \
                          wins over the environment, which wins over the file.";

/// The exit code of a configuration problem, in both binaries.
pub const CONFIG_EXIT: u8 = 2;

/// Reports a configuration problem the same way in both binaries (`<bin>: configuration:
/// <what>` on stderr, before any logging exists) and gives the exit code for it.
pub fn refuse(bin: &str, problem: &dyn std::fmt::Display) -> std::process::ExitCode {
    eprintln!("{bin}: configuration: {problem}");
    std::process::ExitCode::from(CONFIG_EXIT)
}

/// Every problem found in a configuration, so an operator fixes them in one round instead of
/// one per restart. Shown as one line: the problem itself when there is one, else
/// `N problems: a; b; c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems<E>(Vec<E>);

impl<E> Default for Problems<E> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<E> Problems<E> {
    /// No problems yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `r`, or `None` with its error recorded.
    pub fn take<T>(&mut self, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.0.push(e);
                None
            }
        }
    }

    /// Records a problem.
    pub fn push(&mut self, e: E) {
        self.0.push(e);
    }

    /// `value` when nothing was recorded (and it is `Some`), else every problem.
    ///
    /// # Panics
    /// Never on purpose: a `None` with no problem recorded is a bug in the caller, reported as
    /// an empty `Problems` rather than a panic.
    pub fn finish<T>(self, value: Option<T>) -> Result<T, Self> {
        match value {
            Some(v) if self.0.is_empty() => Ok(v),
            _ => Err(self),
        }
    }

    /// The problems, in the order found.
    pub fn list(&self) -> &[E] {
        &self.0
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Problems<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [] => f.write_str("invalid (no detail recorded)"),
            [one] => one.fmt(f),
            many => {
                write!(f, "{} problems: ", many.len())?;
                for (i, e) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    e.fmt(f)?;
                }
                Ok(())
            }
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for Problems<E> {}

/// How a `doctor` check came out (both binaries' `doctor` subcommands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but an operator should know.
    Warn,
    /// Messages will not be answered (or the program cannot work) until this is fixed.
    Fail,
}

/// One line of a `doctor` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How it came out.
    pub level: Level,
    /// What was checked: a variable name or a short noun.
    pub check: &'static str,
    /// What was found, and what to do about it; one sentence without secrets.
    pub text: String,
}

impl Finding {
    /// A finding.
    pub fn new(level: Level, check: &'static str, text: impl Into<String>) -> Self {
        Self {
            level,
            check,
            text: text.into(),
        }
    }
}

/// `ok    <check>: <text>`, `warn  …` or `FAIL  …`.
impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.level {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        write!(f, "{level:<4}  {}: {}", self.check, self.text)
    }
}

/// The flag of a variable: `MATRIX_HOMESERVER_URL` → `matrix-homeserver-url`.
pub fn flag_of(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// The clap command for a binary with these settings and subcommands.
pub fn command(
    bin: &'static str,
    version: &'static str,
    about: &'static str,
    vars: &[Var],
    subcommands: &[(&'static str, &'static str)],
) -> Command {
    let mut cmd = Command::new(bin)
        .version(version)
        .about(about)
        .after_help(PRECEDENCE)
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .help("TOML file of settings, keyed by variable name")
                .action(ArgAction::Set),
        );
    let secrets: Vec<String> = vars
        .iter()
        .filter(|v| v.secret)
        .map(|v| format!("  {}  {}", v.name, v.help))
        .collect();
    if !secrets.is_empty() {
        cmd = cmd.after_help(format!(
            "{PRECEDENCE}\n\nSecrets, from the environment or the --config file only (never \
             flags, which other users can read in `ps`); `<NAME>_FILE` names a file holding the \
             value instead (Docker and Kubernetes secrets):\n{}",
            secrets.join("\n")
        ));
    }
    for var in vars.iter().filter(|v| !v.secret) {
        let mut help = format!("{} [env: {}]", var.help, var.name);
        if !var.default.is_empty() {
            help.push_str(&format!(" [default: {}]", var.default));
        }
        cmd = cmd.arg(
            Arg::new(var.name)
                .long(flag_of(var.name))
                .value_name("VALUE")
                .help(help)
                .hide(var.hidden)
                .action(ArgAction::Set),
        );
    }
    for (name, about) in subcommands {
        cmd = cmd.subcommand(Command::new(*name).about(*about));
    }
    cmd
}

/// Parses `args` (the program name first) with `env` as the environment; reads `--config`.
pub fn parse(
    cmd: Command,
    vars: &[Var],
    args: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Invocation, CliError> {
    let matches = cmd.try_get_matches_from(args)?;
    let mut lookup = Lookup::default();
    for var in vars {
        if let Some(v) = matches.try_get_one::<String>(var.name).ok().flatten() {
            lookup.flags.insert(var.name.to_owned(), v.clone());
        }
        if let Some(v) = env(var.name) {
            lookup.env.insert(var.name.to_owned(), v);
        } else if let Some(path) = var
            .secret
            .then(|| env(&format!("{}_FILE", var.name)))
            .flatten()
        {
            lookup.env.insert(
                var.name.to_owned(),
                read_secret(var.name, Path::new(&path))?,
            );
        }
    }
    if let Some(path) = matches.get_one::<String>("config") {
        lookup.file = read_file(Path::new(path), vars)?;
    }
    Ok(match matches.subcommand() {
        Some((sub, sub_matches)) => {
            for id in sub_matches.ids() {
                if let Some(v) = sub_matches
                    .try_get_one::<String>(id.as_str())
                    .ok()
                    .flatten()
                {
                    lookup.args.insert(id.as_str().to_owned(), v.clone());
                }
            }
            Invocation::Sub(sub.to_owned(), lookup)
        }
        None => Invocation::Run(lookup),
    })
}

/// A secret from its `<NAME>_FILE`: the file's text without its trailing line break.
fn read_secret(var: &'static str, path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::SecretFile {
        var,
        path: path.to_owned(),
        source,
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// The settings in a TOML file: strings, numbers and booleans, keyed by variable name.
fn read_file(path: &Path, vars: &[Var]) -> Result<BTreeMap<String, String>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(&text, vars).map_err(|problems| CliError::File {
        path: path.to_owned(),
        problems: problems.join("; "),
    })
}

/// The settings in TOML `text`, or every problem with it (pure).
pub fn parse_file(text: &str, vars: &[Var]) -> Result<BTreeMap<String, String>, Vec<String>> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| vec![format!("not valid TOML: {}", e.message())])?;
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    for (key, value) in table {
        if !vars.iter().any(|v| v.name == key) {
            problems.push(format!("unknown setting `{key}`"));
            continue;
        }
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                problems.push(format!(
                    "`{key}` must be a string, number or boolean, not {}",
                    other.type_str()
                ));
                continue;
            }
        };
        out.insert(key, value);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const VARS: &[Var] = &[
        Var {
            name: "AGENT_BIND",
            default: "127.0.0.1:8700",
            help: "where to listen",
            secret: false,
            hidden: false,
        },
        Var {
            name: "AGENT_TOKEN",
            default: "",
            help: "the shared secret",
            secret: true,
            hidden: false,
        },
    ];

    fn cmd() -> Command {
        command(
            "agent",
            "1.2.3",
            "The agent.",
            VARS,
            &[("doctor", "checks")],
        )
    }

    fn args(a: &[&str]) -> Vec<OsString> {
        std::iter::once("agent")
            .chain(a.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn help_lists_every_variable_with_its_default() {
        let help = cmd().render_long_help().to_string();
        assert!(help.contains("--agent-bind <VALUE>"), "{help}");
        assert!(
            help.contains("[env: AGENT_BIND] [default: 127.0.0.1:8700]"),
            "{help}"
        );
        assert!(help.contains("  AGENT_TOKEN  the shared secret"), "{help}");
        assert!(
            !help.contains("--agent-token"),
            "no flag for a secret: {help}"
        );
        assert!(help.contains("--config <FILE>"), "{help}");
        assert!(help.contains("doctor"), "{help}");
        let e = parse(cmd(), VARS, args(&["--version"]), |_| None).unwrap_err();
        assert!(e.to_string().contains("agent 1.2.3"), "{e}");
    }

    #[test]
    fn a_flag_beats_the_environment_which_beats_the_file() {
        let dir = tempfile_dir();
        let file = dir.join("agent.toml");
        std::fs::write(
            &file,
            "AGENT_BIND = \"0.0.0.0:1\"\nAGENT_TOKEN = \"from-file\"\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let env = |k: &str| (k == "AGENT_BIND").then(|| "0.0.0.0:2".to_owned());

        let Invocation::Run(l) = parse(cmd(), VARS, args(&["--config", file]), |_| None).unwrap()
        else {
            panic!()
        };
        assert_eq!(l.get("AGENT_BIND").as_deref(), Some("0.0.0.0:1"), "file");
        let Invocation::Run(l) = parse(cmd(), VARS, args(&["--config", file]), env).unwrap() else {
            panic!()
        };
        assert_eq!(
            l.get("AGENT_BIND").as_deref(),
            Some("0.0.0.0:2"),
            "env over file"
        );
        assert_eq!(l.get("AGENT_TOKEN").as_deref(), Some("from-file"));
        let a = args(&["--config", file, "--agent-bind", "0.0.0.0:3", "doctor"]);
        let Invocation::Sub(sub, l) = parse(cmd(), VARS, a, env).unwrap() else {
            panic!()
        };
        assert_eq!(sub, "doctor");
        assert_eq!(
            l.get("AGENT_BIND").as_deref(),
            Some("0.0.0.0:3"),
            "flag over env"
        );
        assert_eq!(l.get("NOT_A_SETTING"), None);

        let with_args = cmd().subcommand(
            Command::new("probe").arg(Arg::new("room").long("room").action(ArgAction::Set)),
        );
        let a = args(&["probe", "--room", "!r:hs"]);
        let Invocation::Sub(sub, l) = parse(with_args, VARS, a, |_| None).unwrap() else {
            panic!()
        };
        assert_eq!((sub.as_str(), l.arg("room")), ("probe", Some("!r:hs")));
        assert_eq!(l.arg("sender"), None);
    }

    #[test]
    fn every_problem_in_a_file_is_reported_at_once() {
        let problems =
            parse_file("AGENT_BIND = [1]\nAGENT_TOKN = \"x\"\nPORT = 3\n", VARS).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("`AGENT_TOKN`")));
        assert!(problems.iter().any(|p| p.contains("`AGENT_BIND` must be")));
        let ok = parse_file("AGENT_BIND = 8700\nAGENT_TOKEN = true\n", VARS).unwrap();
        assert_eq!(ok["AGENT_BIND"], "8700");
        assert_eq!(ok["AGENT_TOKEN"], "true");
        assert!(parse_file("AGENT_BIND = ", VARS).unwrap_err()[0].contains("not valid TOML"));
    }

    #[test]
    fn a_secret_can_come_from_a_file_but_the_variable_wins() {
        let dir = tempfile_dir();
        let file = dir.join("token");
        std::fs::write(&file, "from-a-secret-file\n").unwrap();
        let path = file.to_str().unwrap().to_owned();
        let env = |k: &str| match k {
            "AGENT_TOKEN_FILE" | "AGENT_BIND_FILE" => Some(path.clone()),
            _ => None,
        };
        let Invocation::Run(l) = parse(cmd(), VARS, args(&[]), env).unwrap() else {
            panic!()
        };
        assert_eq!(l.get("AGENT_TOKEN").as_deref(), Some("from-a-secret-file"));
        assert_eq!(
            l.get("AGENT_BIND"),
            None,
            "only secrets have _FILE variants"
        );
        let env2 = |k: &str| match k {
            "AGENT_TOKEN" => Some("direct".to_owned()),
            "AGENT_TOKEN_FILE" => Some(path.clone()),
            _ => None,
        };
        let Invocation::Run(l) = parse(cmd(), VARS, args(&[]), env2).unwrap() else {
            panic!()
        };
        assert_eq!(l.get("AGENT_TOKEN").as_deref(), Some("direct"));
        let missing = |k: &str| (k == "AGENT_TOKEN_FILE").then(|| "/nonexistent/t".to_owned());
        let e = parse(cmd(), VARS, args(&[]), missing)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("AGENT_TOKEN_FILE /nonexistent/t: "), "{e}");
    }

    #[test]
    fn problems_are_collected_and_shown_on_one_line() {
        let mut p: Problems<String> = Problems::new();
        assert_eq!(p.take(Ok::<_, String>(1)), Some(1));
        assert_eq!(p.clone().finish(Some(5)), Ok(5));
        assert_eq!(p.take(Err::<u8, _>("A is required".to_owned())), None);
        assert_eq!(p.to_string(), "A is required");
        p.push("B is invalid: no".to_owned());
        assert_eq!(p.to_string(), "2 problems: A is required; B is invalid: no");
        assert_eq!(p.clone().finish(Some(5)).unwrap_err().list().len(), 2);
        let empty: Problems<String> = Problems::new();
        assert!(
            empty.finish(None::<u8>).is_err(),
            "None without a problem is still an error"
        );
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("settings-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
