//! `surface doctor`'s login checks against a homeserver that speaks as a real one would
//! (wiremock on port 0): an OAuth 2.0-only homeserver (the Matrix Authentication Service's
//! answers: OAuth 2.0 server metadata, no `m.login.password`) is recognised and the way in named;
//! a token the homeserver soft-logged-out is explained.

use serde_json::json;
use surface::config::Config;
use surface::doctor::{Finding, Level};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn homeserver(oauth_only: bool) -> MockServer {
    let server = MockServer::start().await;
    let answer = |body| ResponseTemplate::new(200).set_body_json(body);
    Mock::given(method("GET"))
        .and(path("/_matrix/client/versions"))
        .respond_with(answer(json!({"versions": ["v1.15"]})))
        .mount(&server)
        .await;
    let flows = if oauth_only {
        // MAS answers `/login` for compatibility sessions: SSO and token logins only.
        json!({"flows": [{"type": "m.login.sso"}, {"type": "m.login.token"}]})
    } else {
        json!({"flows": [{"type": "m.login.password"}]})
    };
    Mock::given(method("GET"))
        .and(path("/_matrix/client/v3/login"))
        .respond_with(answer(flows))
        .mount(&server)
        .await;
    let metadata = if oauth_only {
        answer(json!({
            "issuer": format!("{}/", server.uri()),
            "authorization_endpoint": format!("{}/authorize", server.uri()),
            "token_endpoint": format!("{}/oauth2/token", server.uri()),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
        }))
    } else {
        ResponseTemplate::new(404)
            .set_body_json(json!({"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}))
    };
    Mock::given(method("GET"))
        .and(path("/_matrix/client/v1/auth_metadata"))
        .respond_with(metadata)
        .mount(&server)
        .await;
    // Synapse's words for an expired access token.
    Mock::given(method("GET"))
        .and(path("/_matrix/client/v3/account/whoami"))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "errcode": "M_UNKNOWN_TOKEN",
            "error": "Access token has expired",
            "soft_logout": true,
        })))
        .mount(&server)
        .await;
    server
}

fn config(hs: &str, state: &std::path::Path, auth: &[(&str, &str)]) -> Config {
    let state = state.display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("MATRIX_HOMESERVER_URL", hs),
        ("MATRIX_USER_ID", "@bot:hs"),
        ("AGENT_URL", "ws://127.0.0.1:9"),
        ("AGENT_TOKEN", "0123456789abcdef"),
        ("WORKSPACE_ROOT", &state),
        ("SURFACE_STATE_DIR", &state),
        ("SURFACE_HEALTH_BIND", "127.0.0.1:9"),
    ];
    env.extend_from_slice(auth);
    Config::from_pairs(&env).unwrap()
}

fn line<'a>(findings: &'a [Finding], check: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check} line: {findings:?}"))
}

#[tokio::test]
async fn an_oauth_only_homeserver_is_recognised_and_the_way_in_named() {
    let hs = homeserver(true).await;
    let dir = tempfile::tempdir().unwrap();
    let password = config(&hs.uri(), dir.path(), &[("MATRIX_PASSWORD", "pw")]);
    let findings = surface::doctor::examine(&password, None, None).await;
    let ways = line(&findings, "ways in");
    assert_eq!(ways.level, Level::Fail, "{ways:?}");
    assert!(
        ways.text.contains("only OAuth 2.0") && ways.text.contains("issue-compatibility-token"),
        "{ways:?}"
    );
    assert_eq!(surface::doctor::exit_code(&findings), 1);

    // With a compatibility token the way in is fine; the token itself expired (soft logout,
    // no refresh token, no password): the login line says what to do.
    let token = config(
        &hs.uri(),
        dir.path(),
        &[
            ("MATRIX_ACCESS_TOKEN", "mct_abc"),
            ("MATRIX_DEVICE_ID", "DEV"),
        ],
    );
    let findings = surface::doctor::examine(&token, None, None).await;
    assert_eq!(line(&findings, "ways in").level, Level::Ok);
    let login = line(&findings, "login");
    assert_eq!(login.level, Level::Fail, "{login:?}");
    assert!(
        login.text.starts_with("soft_logout") && login.text.contains("MATRIX_PASSWORD"),
        "{login:?}"
    );
    assert!(!login.text.contains("mct_abc"), "the token is never shown");
}

#[tokio::test]
async fn a_password_homeserver_is_fine_and_a_soft_logout_with_a_password_is_a_warning() {
    let hs = homeserver(false).await;
    let dir = tempfile::tempdir().unwrap();
    let both = config(
        &hs.uri(),
        dir.path(),
        &[
            ("MATRIX_ACCESS_TOKEN", "syt_abc"),
            ("MATRIX_DEVICE_ID", "DEV"),
            ("MATRIX_PASSWORD", "pw"),
        ],
    );
    let findings = surface::doctor::examine(&both, None, None).await;
    let ways = line(&findings, "ways in");
    assert_eq!(
        (ways.level, ways.text.as_str()),
        (Level::Ok, "password login offered")
    );
    let login = line(&findings, "login");
    assert_eq!(login.level, Level::Warn, "{login:?}");
    assert!(login.text.contains("logs in again"), "{login:?}");
}
