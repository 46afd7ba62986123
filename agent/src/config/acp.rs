//! The Agent Client Protocol brain's settings (`AGENT_BRAIN=acp`): which agent to run, what it
//! may see of the environment, how many run at once and for how long.

use std::time::Duration;

use super::{ConfigError, err};

/// Settings of the ACP brain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpConfig {
    /// The agent's program (`AGENT_ACP_COMMAND`'s first word), a path or a name in `PATH`.
    pub program: String,
    /// Its arguments (the rest, split like a POSIX shell would, without expansions).
    pub args: Vec<String>,
    /// Variables of the agent's own environment passed to it (`AGENT_ACP_ENV`) besides the
    /// basic ones (`PATH`, `HOME`, locale, `TMPDIR`); nothing else reaches it.
    pub pass_env: Vec<String>,
    /// Most agent processes alive at once (`AGENT_ACP_SESSIONS`); the least recently used idle
    /// one is closed to make room.
    pub max_sessions: usize,
    /// A session unused this long is closed (`AGENT_ACP_IDLE`); the next turn resumes it.
    pub idle: Duration,
    /// Longest wait for the agent to start and open or resume a session (`AGENT_ACP_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// Longest silence during a turn before it is cancelled (`AGENT_ACP_TURN_IDLE`).
    pub turn_idle: Duration,
}

impl AcpConfig {
    /// The defaults for `command`.
    pub fn new(program: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            program: program.into(),
            args,
            pass_env: Vec::new(),
            max_sessions: 4,
            idle: Duration::from_secs(15 * 60),
            start_timeout: Duration::from_secs(60),
            turn_idle: Duration::from_secs(10 * 60),
        }
    }
}

const COMMAND: &str = "AGENT_ACP_COMMAND";
const ENV: &str = "AGENT_ACP_ENV";

/// Prefixes of variables never passed to an agent: the agent's and the surface's own settings
/// hold their secrets (the agent token, the database URL, MCP tokens, the bot's password).
const NEVER_PASSED: &[&str] = &["AGENT_", "MATRIX_", "SURFACE_"];

/// Splits `AGENT_ACP_COMMAND` into the program and its arguments.
pub fn parse_command(command: &str) -> Result<(String, Vec<String>), ConfigError> {
    let words =
        shlex::split(command).ok_or_else(|| err(COMMAND, "has an unclosed quote or escape"))?;
    let mut words = words.into_iter();
    let program = words
        .next()
        .ok_or_else(|| err(COMMAND, "is required when AGENT_BRAIN=acp"))?;
    Ok((program, words.collect()))
}

/// Parses `AGENT_ACP_ENV`: variable names separated by commas or whitespace.
pub fn parse_env(list: &str) -> Result<Vec<String>, ConfigError> {
    let mut names = Vec::new();
    for name in list.split([',', ' ', '\n', '\t']).filter(|n| !n.is_empty()) {
        let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(err(ENV, format!("{name:?} is not a variable name")));
        }
        if let Some(prefix) = NEVER_PASSED.iter().find(|p| name.starts_with(**p)) {
            return Err(err(
                ENV,
                format!("{name} is never passed to an agent ({prefix}* settings hold secrets)"),
            ));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line and what it splits into (`None`: refused).
    type Case<'a> = (&'a str, Option<(&'a str, &'a [&'a str])>);

    #[test]
    fn commands_split_like_a_shell() {
        let cases: &[Case] = &[
            ("hermes-acp", Some(("hermes-acp", &[]))),
            (
                "gemini --experimental-acp",
                Some(("gemini", &["--experimental-acp"])),
            ),
            (
                "python3 '/srv/my agent.py' -v",
                Some(("python3", &["/srv/my agent.py", "-v"])),
            ),
            ("python3 'unclosed", None),
            ("   ", None),
        ];
        for (command, want) in cases {
            let got = parse_command(command).ok();
            let want = want.map(|(p, a)| {
                (
                    p.to_owned(),
                    a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                )
            });
            assert_eq!(got, want, "{command:?}");
        }
    }

    #[test]
    fn secrets_of_ours_are_never_passed() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            ("", Some(&[])),
            (
                "HERMES_HOME, ANTHROPIC_API_KEY",
                Some(&["HERMES_HOME", "ANTHROPIC_API_KEY"]),
            ),
            ("A A", Some(&["A"])),
            ("AGENT_TOKEN", None),
            ("AGENT_DATABASE_URL_FILE", None),
            ("MATRIX_PASSWORD", None),
            ("SURFACE_ANYTHING", None),
            ("1BAD", None),
            ("BAD-NAME", None),
        ];
        for (list, want) in cases {
            let got = parse_env(list).ok();
            let want = want.map(|w| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
            assert_eq!(got, want, "{list:?}");
        }
    }
}
