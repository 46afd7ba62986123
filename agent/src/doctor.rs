//! `agent doctor`: checks the configuration, the workspace, the state directory, the listening
//! address and the model server, one finding per check. Decide, then do: [`observe`] looks
//! (touching nothing but a probe file it removes again), the pure functions here turn what it
//! saw into [`Finding`]s. No finding carries a secret: the API key is only ever sent.

mod brain;
mod leases;
mod observe;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use settings::Problems;

pub use self::brain::{brain_acp, brain_builtin, model_server, transcription, vision};
pub use self::observe::{BindSeen, DbSeen, DirSeen, ModelsSeen, SentinelSeen, VisionSeen};
use crate::config::{BrainConfig, Config, ConfigError};
pub use settings::{Finding, Level};

/// The findings and the exit code of `agent doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// In the order checked.
    pub findings: Vec<Finding>,
    /// 0 without a failure, 1 with one, [`settings::CONFIG_EXIT`] when the configuration is
    /// invalid (nothing else is checked then).
    pub exit_code: u8,
}

/// Runs every check on the settings `get` finds.
pub async fn doctor(get: impl Fn(&str) -> Option<String>) -> Report {
    match Config::from_lookup(get) {
        Err(problems) => Report {
            findings: configuration_problems(&problems),
            exit_code: settings::CONFIG_EXIT,
        },
        Ok(config) => {
            let brain = match &config.brain {
                BrainConfig::Builtin => "builtin".to_owned(),
                BrainConfig::OpenAi(o) => format!("openai, model {:?}", o.model),
                BrainConfig::Acp(a) => format!("acp, agent {:?}", a.program),
            };
            let mut findings = vec![Finding::new(
                Level::Ok,
                "config",
                format!("valid; brain {brain}"),
            )];
            findings.extend(check(&config).await);
            let exit_code = exit_code(&findings);
            Report {
                findings,
                exit_code,
            }
        }
    }
}

/// Checks a valid configuration against the machine: workspace, state, address, model.
pub async fn check(config: &Config) -> Vec<Finding> {
    let root = &config.workspace_root;
    let mut findings = vec![
        workspace(root, &observe::workspace(root)),
        shared_workspace(&observe::sentinel(root)),
    ];
    match &config.database {
        Some(db) => {
            let seen = observe::database(db).await;
            findings.push(database(&seen));
            // The leases, once the database answers with tables.
            if let (DbSeen::Schema { found: 1.., .. }, Ok(pool)) =
                (&seen, crate::db::Database::connect(db))
            {
                findings.push(leases::check(&leases::observe(&pool).await));
            }
        }
        None => findings.push(state_dir(
            &config.state_dir,
            &observe::dir(&config.state_dir),
        )),
    }
    findings.push(bind(config.bind, &observe::bind(config.bind).await));
    match &config.brain {
        BrainConfig::Builtin => findings.push(brain_builtin()),
        BrainConfig::Acp(a) => findings.push(brain_acp(&a.program, observe::program(&a.program))),
        BrainConfig::OpenAi(o) => {
            findings.push(model_server(o, &observe::models(o).await));
            findings.push(vision(o, &observe::vision(o).await));
        }
    }
    findings.push(transcription(config.transcribe.as_ref()));
    findings
}

/// One failure per configuration problem (`FAIL  config: <problem>`).
pub fn configuration_problems(problems: &Problems<ConfigError>) -> Vec<Finding> {
    problems
        .list()
        .iter()
        .map(|p| Finding::new(Level::Fail, "config", p.to_string()))
        .collect()
}

/// 1 when any finding is a failure, else 0.
pub fn exit_code(findings: &[Finding]) -> u8 {
    u8::from(findings.iter().any(|f| f.level == Level::Fail))
}

/// The workspace root: a folder the agent can write in (below `chats/`).
pub fn workspace(root: &Path, seen: &(DirSeen, Option<DirSeen>)) -> Finding {
    const CHECK: &str = "workspace";
    let root = root.display();
    let fail = |text: String| Finding::new(Level::Fail, CHECK, text);
    match seen {
        (DirSeen::Missing { .. }, _) => fail(format!(
            "{root} does not exist (mount the shared workspace there)"
        )),
        (DirSeen::NotADirectory, _) => fail(format!("{root} is not a folder")),
        (DirSeen::Unreadable(e), _) => fail(format!("cannot look at {root}: {e}")),
        (DirSeen::NotWritable(e), _) => fail(format!("cannot write in {root}: {e}")),
        (DirSeen::Writable, Some(DirSeen::NotWritable(e) | DirSeen::Unreadable(e))) => {
            fail(format!("cannot write in {root}/chats: {e}"))
        }
        (DirSeen::Writable, Some(DirSeen::NotADirectory)) => {
            fail(format!("{root}/chats is not a folder"))
        }
        (DirSeen::Writable, _) => Finding::new(Level::Ok, CHECK, format!("{root} is writable")),
    }
}

/// Whether the surface has written its sentinel here, i.e. shares this folder.
pub fn shared_workspace(seen: &SentinelSeen) -> Finding {
    const CHECK: &str = "sentinel";
    const DIR: &str = "surfaces/matrix/.sentinel/";
    match seen {
        SentinelSeen::Newest(age) => Finding::new(
            Level::Ok,
            CHECK,
            format!(
                "the surface's sentinel is here (written {} ago): the surface uses this folder",
                humantime::format_duration(Duration::from_secs(age.as_secs()))
            ),
        ),
        SentinelSeen::None => Finding::new(
            Level::Warn,
            CHECK,
            format!(
                "no surface sentinel in {DIR}: the surface has not connected yet, or mounts \
                 another folder"
            ),
        ),
        SentinelSeen::Unreadable(e) => {
            Finding::new(Level::Warn, CHECK, format!("cannot read {DIR}: {e}"))
        }
    }
}

/// The state directory: writable, or creatable by the agent.
pub fn state_dir(dir: &Path, seen: &DirSeen) -> Finding {
    const CHECK: &str = "state";
    let dir = dir.display();
    let fail = |text: String| Finding::new(Level::Fail, CHECK, text);
    match seen {
        DirSeen::Writable => Finding::new(Level::Ok, CHECK, format!("{dir} is writable")),
        DirSeen::Missing {
            parent_writable: true,
        } => Finding::new(
            Level::Ok,
            CHECK,
            format!("{dir} does not exist yet; the agent creates it"),
        ),
        DirSeen::Missing {
            parent_writable: false,
        } => fail(format!(
            "{dir} does not exist and cannot be created (the folder above it is not writable)"
        )),
        DirSeen::NotADirectory => fail(format!("{dir} is not a folder")),
        DirSeen::Unreadable(e) => fail(format!("cannot look at {dir}: {e}")),
        DirSeen::NotWritable(e) => fail(format!("cannot write in {dir}: {e}")),
    }
}

/// Whether the agent's database answers with a schema this agent can use.
pub fn database(seen: &DbSeen) -> Finding {
    const CHECK: &str = "state";
    match seen {
        DbSeen::Unreachable(e) => Finding::new(
            Level::Fail,
            CHECK,
            format!("AGENT_DATABASE_URL: cannot ask the database: {e}"),
        ),
        DbSeen::Schema { found, known } if found > known => Finding::new(
            Level::Fail,
            CHECK,
            format!(
                "the database schema is at version {found}, newer than this agent knows ({known}): a newer agent migrated it; run that version"
            ),
        ),
        DbSeen::Schema { found: 0, .. } => Finding::new(
            Level::Ok,
            CHECK,
            "PostgreSQL answers; the agent creates its tables at start",
        ),
        DbSeen::Schema { found, known } if found < known => Finding::new(
            Level::Ok,
            CHECK,
            format!(
                "PostgreSQL answers, schema version {found}; the agent migrates it to {known} at start"
            ),
        ),
        DbSeen::Schema { found, .. } => Finding::new(
            Level::Ok,
            CHECK,
            format!("PostgreSQL answers, schema version {found}"),
        ),
    }
}

/// What listens on the agent's address.
pub fn bind(addr: SocketAddr, seen: &BindSeen) -> Finding {
    const CHECK: &str = "listen";
    match seen {
        BindSeen::Agent => Finding::new(Level::Ok, CHECK, format!("an agent is running on {addr}")),
        BindSeen::Free => Finding::new(
            Level::Warn,
            CHECK,
            format!("nothing listens on {addr} (is the agent running?)"),
        ),
        BindSeen::Other(what) => Finding::new(
            Level::Fail,
            CHECK,
            format!("something other than an agent listens on {addr} ({what})"),
        ),
        BindSeen::Unbindable(e) => Finding::new(
            Level::Fail,
            CHECK,
            format!("nothing listens on {addr}, and the agent could not either: {e}"),
        ),
        BindSeen::Unknown(e) => Finding::new(
            Level::Warn,
            CHECK,
            format!("cannot tell whether anything listens on {addr}: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn levels(findings: &[Finding]) -> Vec<Level> {
        findings.iter().map(|f| f.level).collect()
    }

    #[test]
    fn lines_and_exit_codes() {
        let ok = Finding::new(Level::Ok, "listen", "an agent is running on 127.0.0.1:1");
        let warn = Finding::new(Level::Warn, "brain", "w");
        let fail = Finding::new(Level::Fail, "model", "f");
        assert_eq!(
            ok.to_string(),
            "ok    listen: an agent is running on 127.0.0.1:1"
        );
        assert_eq!(warn.to_string(), "warn  brain: w");
        assert_eq!(fail.to_string(), "FAIL  model: f");
        assert_eq!(exit_code(&[ok.clone(), warn.clone()]), 0);
        assert_eq!(exit_code(&[ok, warn, fail]), 1);
        assert_eq!(exit_code(&[]), 0);
    }

    #[test]
    fn configuration_problems_are_one_failure_each() {
        let problems = Config::from_lookup(|k| match k {
            "AGENT_BIND" => Some("nope".into()),
            "AGENT_MAX_PENDING" => Some("0".into()),
            _ => None,
        })
        .unwrap_err();
        let findings = configuration_problems(&problems);
        assert_eq!(levels(&findings), [Level::Fail; 3]);
        assert!(
            findings[0]
                .to_string()
                .starts_with("FAIL  config: AGENT_BIND: ")
        );
        assert!(findings[1].text.starts_with("AGENT_TOKEN: is required"));
    }

    #[test]
    fn workspace_and_state_folders() {
        let root = PathBuf::from("/ws");
        type Case<'a> = ((DirSeen, Option<DirSeen>), Level, &'a str);
        let cases: &[Case] = &[
            ((DirSeen::Writable, None), Level::Ok, "/ws is writable"),
            (
                (DirSeen::Writable, Some(DirSeen::Writable)),
                Level::Ok,
                "/ws is writable",
            ),
            (
                (
                    DirSeen::Missing {
                        parent_writable: true,
                    },
                    None,
                ),
                Level::Fail,
                "/ws does not exist",
            ),
            ((DirSeen::NotADirectory, None), Level::Fail, "not a folder"),
            (
                (DirSeen::NotWritable("Permission denied".into()), None),
                Level::Fail,
                "cannot write in /ws: Permission denied",
            ),
            (
                (
                    DirSeen::Writable,
                    Some(DirSeen::NotWritable("Read-only file system".into())),
                ),
                Level::Fail,
                "cannot write in /ws/chats: Read-only",
            ),
        ];
        for (seen, level, text) in cases {
            let f = workspace(&root, seen);
            assert_eq!((f.level, f.check), (*level, "workspace"), "{seen:?}");
            assert!(f.text.contains(text), "{seen:?}: {f}");
        }
        let dir = PathBuf::from("/var/lib/agent");
        let cases: &[(DirSeen, Level, &str)] = &[
            (DirSeen::Writable, Level::Ok, "is writable"),
            (
                DirSeen::Missing {
                    parent_writable: true,
                },
                Level::Ok,
                "the agent creates it",
            ),
            (
                DirSeen::Missing {
                    parent_writable: false,
                },
                Level::Fail,
                "cannot be created",
            ),
            (DirSeen::NotADirectory, Level::Fail, "not a folder"),
            (
                DirSeen::Unreadable("Permission denied".into()),
                Level::Fail,
                "cannot look at",
            ),
        ];
        for (seen, level, text) in cases {
            let f = state_dir(&dir, seen);
            assert_eq!(f.level, *level, "{seen:?}");
            assert!(f.text.contains(text), "{seen:?}: {f}");
        }
    }

    #[test]
    fn sentinels_and_addresses() {
        let cases: &[(SentinelSeen, Level, &str)] = &[
            (
                SentinelSeen::Newest(Duration::from_millis(125_500)),
                Level::Ok,
                "written 2m 5s ago",
            ),
            (SentinelSeen::None, Level::Warn, "no surface sentinel"),
            (
                SentinelSeen::Unreadable("Permission denied".into()),
                Level::Warn,
                "cannot read",
            ),
        ];
        for (seen, level, text) in cases {
            let f = shared_workspace(seen);
            assert_eq!(f.level, *level, "{seen:?}");
            assert!(f.text.contains(text), "{seen:?}: {f}");
        }
        let addr: SocketAddr = "127.0.0.1:8700".parse().unwrap();
        let cases: &[(BindSeen, Level, &str)] = &[
            (
                BindSeen::Agent,
                Level::Ok,
                "an agent is running on 127.0.0.1:8700",
            ),
            (
                BindSeen::Free,
                Level::Warn,
                "nothing listens on 127.0.0.1:8700 (is the agent running?)",
            ),
            (
                BindSeen::Other("GET /healthz answered HTTP 404".into()),
                Level::Fail,
                "something other than an agent",
            ),
            (
                BindSeen::Unbindable("Address not available".into()),
                Level::Fail,
                "could not either: Address not available",
            ),
            (
                BindSeen::Unknown("timed out".into()),
                Level::Warn,
                "cannot tell",
            ),
        ];
        for (seen, level, text) in cases {
            let f = bind(addr, seen);
            assert_eq!(f.level, *level, "{seen:?}");
            assert!(f.text.contains(text), "{seen:?}: {f}");
        }
    }
}
