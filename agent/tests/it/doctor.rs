//! `agent doctor`'s checks against a running agent and a fake model server on 127.0.0.1:0:
//! healthy, the model missing, the key refused, the server down, and a bad configuration.

use std::collections::BTreeMap;

use agent::doctor::{Level, Report, doctor};
use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use crate::support::*;

const KEY: &str = "sk-doctor-secret-key";

/// A model server listing one model to whoever presents [`KEY`]; its refusal echoes the key
/// it got, as some servers do.
async fn model_server() -> String {
    let router = axum::Router::new().route(
        "/v1/models",
        get(|headers: HeaderMap| async move {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            if auth != format!("Bearer {KEY}") {
                let said = format!("Incorrect API key provided: {auth}");
                return (
                    StatusCode::UNAUTHORIZED,
                    Json(json!({"error": {"message": said}})),
                )
                    .into_response();
            }
            Json(json!({"object": "list", "data": [
                {"id": "served-model", "object": "model"},
                {"id": "embedder", "object": "model"},
            ]}))
            .into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

/// A local address nothing listens on.
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// The doctor's report for `agent`'s folders and address, with `vars` on top.
async fn examine(agent: &TestAgent, vars: &[(&str, &str)]) -> (Report, String) {
    let mut settings: BTreeMap<String, String> = [
        ("AGENT_TOKEN", TOKEN.to_owned()),
        ("AGENT_BIND", agent.addr.to_string()),
        (
            "WORKSPACE_ROOT",
            agent.workspace.path().display().to_string(),
        ),
        ("AGENT_STATE_DIR", agent.state.path().display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in vars {
        settings.insert((*k).to_owned(), (*v).to_owned());
    }
    let report = doctor(|k| settings.get(k).cloned()).await;
    let text: String = report.findings.iter().map(|f| format!("{f}\n")).collect();
    assert!(!text.contains(KEY), "the key is never shown: {text}");
    (report, text)
}

fn line<'a>(text: &'a str, check: &str) -> &'a str {
    text.lines()
        .find(|l| l[6..].starts_with(&format!("{check}: ")))
        .unwrap_or_else(|| panic!("no {check} line: {text}"))
}

#[tokio::test]
async fn a_healthy_setup_is_all_ok_but_the_missing_surface() {
    let base = model_server().await;
    let agent = TestAgent::start().await;
    let openai = [
        ("AGENT_BRAIN", "openai"),
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_MODEL", "served-model"),
        ("OPENAI_API_KEY", KEY),
    ];
    let (report, text) = examine(&agent, &openai).await;
    assert_eq!(report.exit_code, 0, "{text}");
    for (check, says) in [
        (
            "config",
            "ok    config: valid; brain openai, model \"served-model\"",
        ),
        ("workspace", "is writable"),
        ("state", "is writable"),
        ("listen", "an agent is running on"),
        ("model", "answers and lists the model \"served-model\""),
    ] {
        let l = line(&text, check);
        assert!(l.starts_with("ok ") && l.contains(says), "{text}");
    }
    // No surface has written its sentinel into this workspace.
    assert!(line(&text, "sentinel").starts_with("warn"), "{text}");
    let (report, text) = examine(&agent, &[]).await;
    assert_eq!(report.exit_code, 0, "{text}");
    assert!(
        line(&text, "brain").starts_with("ok    brain: builtin"),
        "{text}"
    );
}

#[tokio::test]
async fn model_problems_are_named() {
    let base = model_server().await;
    let agent = TestAgent::start().await;
    let with = |model: &'static str, key: &'static str, base: String| {
        vec![
            ("AGENT_BRAIN", "openai".to_owned()),
            ("OPENAI_BASE_URL", base),
            ("OPENAI_MODEL", model.to_owned()),
            ("OPENAI_API_KEY", key.to_owned()),
        ]
    };
    let cases = [
        (
            with("llama-9", KEY, base.clone()),
            Level::Warn,
            "\"llama-9\" is not among its models (\"served-model\", \"embedder\")",
        ),
        (
            // The server echoes the wrong key; the doctor does not.
            with("served-model", "sk-wrong-key", base.clone()),
            Level::Fail,
            "/models answered HTTP 401: Incorrect API key provided: Bearer [redacted] (check \
             OPENAI_API_KEY)",
        ),
        (
            with("served-model", KEY, format!("http://{}/v1", free_address())),
            Level::Fail,
            "cannot reach http://127.0.0.1:",
        ),
    ];
    for (vars, level, says) in cases {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (report, text) = examine(&agent, &vars).await;
        let model = report.findings.iter().find(|f| f.check == "model").unwrap();
        assert_eq!(model.level, level, "{text}");
        assert!(model.text.contains(says), "{text}");
        assert_eq!(report.exit_code, u8::from(level == Level::Fail), "{text}");
    }
}

#[tokio::test]
async fn an_agent_that_is_not_running_and_a_bad_configuration() {
    let agent = TestAgent::start().await;
    let free = free_address();
    let (report, text) = examine(&agent, &[("AGENT_BIND", free.as_str())]).await;
    assert_eq!(report.exit_code, 0, "a warning only: {text}");
    assert_eq!(
        line(&text, "listen"),
        format!("warn  listen: nothing listens on {free} (is the agent running?)")
    );
    let (report, text) = examine(
        &agent,
        &[
            ("AGENT_TOKEN", "short"),
            ("AGENT_BIND", "nowhere"),
            ("AGENT_BRAIN", "magic"),
        ],
    )
    .await;
    assert_eq!(report.exit_code, 2, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "one line per problem, nothing else checked: {text}"
    );
    assert!(
        lines.iter().all(|l| l.starts_with("FAIL  config: ")),
        "{text}"
    );
    assert!(
        lines[0].contains("AGENT_BIND") && lines[2].contains("AGENT_BRAIN"),
        "{text}"
    );
}

/// A server that answers like llama.cpp's `/props` (a projector loaded or not) or Ollama's
/// `/api/show` (the model's capabilities), in the shapes their sources give.
async fn vision_server(llama: Option<bool>, ollama: Option<&'static [&'static str]>) -> String {
    use axum::routing::post;
    let mut router = axum::Router::new().route(
        "/v1/models",
        get(|| async { Json(json!({"data": [{"id": "m"}]})) }),
    );
    if let Some(vision) = llama {
        router = router.route(
            "/props",
            get(move || async move {
                Json(json!({"model_path": "m.gguf", "modalities": {"vision": vision, "audio": false}}))
            }),
        );
    }
    if let Some(caps) = ollama {
        router = router.route(
            "/api/show",
            post(move || async move { Json(json!({"details": {}, "capabilities": caps})) }),
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

#[tokio::test]
async fn the_doctor_reports_whether_the_model_sees_pictures_and_if_speech_is_heard() {
    let agent = TestAgent::start().await;
    /// (`/props` vision, `/api/show` capabilities, the verdict, what it says)
    type Case = (
        Option<bool>,
        Option<&'static [&'static str]>,
        Level,
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            Some(true),
            None,
            Level::Ok,
            "llama.cpp's /props says \"m\" sees pictures",
        ),
        (
            Some(false),
            None,
            Level::Warn,
            "llama.cpp's /props says \"m\" cannot see pictures",
        ),
        (
            None,
            Some(&["completion", "vision"]),
            Level::Ok,
            "Ollama's /api/show says \"m\" sees",
        ),
        (
            None,
            None,
            Level::Ok,
            "does not say whether \"m\" sees pictures",
        ),
    ];
    for (llama, ollama, level, says) in cases {
        let base = vision_server(llama, ollama).await;
        let vars = [
            ("AGENT_BRAIN", "openai"),
            ("OPENAI_BASE_URL", base.as_str()),
            ("OPENAI_MODEL", "m"),
            ("TRANSCRIBE_MODEL", "whisper-1"),
        ];
        let (report, text) = examine(&agent, &vars).await;
        let vision = report
            .findings
            .iter()
            .find(|f| f.check == "vision")
            .unwrap();
        assert_eq!(vision.level, level, "{text}");
        assert!(vision.text.contains(says), "{text}");
        assert!(
            line(&text, "transcription").contains("voice messages go to http://127.0.0.1:"),
            "{text}"
        );
    }
}

/// On PostgreSQL the doctor says the schema version and what the lease table holds: a lease a
/// dead agent left is normal, one that expires later than any agent sets is a warning.
#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_the_schema_and_the_leases_are_checked() {
    let Some(url) = crate::postgres::scratch().await else {
        return;
    };
    let agent = TestAgent::start_with(|c| {
        c.database = Some(agent::db::DatabaseConfig::new(
            protocol::Secret::new(&url),
            4,
        ))
    })
    .await;
    // The agent has created its tables once it answers a handshake.
    let _ = agent
        .connect(&protocol::ChatId::new("doctor").unwrap())
        .await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "INSERT INTO chat_leases (chat_id, holder, token, expires_at) \
             VALUES ('gone', 'dead/1/0', 3, now() - interval '1 minute')",
        )
        .await
        .unwrap();
    let vars = [("AGENT_DATABASE_URL", url.as_str())];
    let (_, text) = examine(&agent, &vars).await;
    let version = agent::db::known_version();
    assert_eq!(
        line(&text, "state"),
        format!("ok    state: PostgreSQL answers, schema version {version}")
    );
    assert_eq!(
        line(&text, "leases"),
        "ok    leases: 0 chat(s) running on 0 agent(s); 1 lease(s) left by agents that \
         stopped, taken over at their chats' next turn"
    );
    let password = url.split_once('@').unwrap().0.rsplit_once(':').unwrap().1;
    assert!(!text.contains(password), "{text}");
    client
        .batch_execute(
            "INSERT INTO chat_leases (chat_id, holder, token, expires_at) \
             VALUES ('stuck', 'odd/1/0', 1, now() + interval '1 day')",
        )
        .await
        .unwrap();
    let (_, text) = examine(&agent, &vars).await;
    assert!(
        line(&text, "leases").starts_with("warn  leases: 1 lease(s) expire"),
        "{text}"
    );
}
