//! What an operator sees: with `LOG_FORMAT=json` both processes log one JSON object per line,
//! (the recovery key's one-time banner aside), each starts with one INFO line saying what it runs (version, brain, addresses; no secret),
//! a normal conversation logs no ERROR line, and both serve Prometheus `/metrics`.

use e2e::StackOptions;
use serde_json::Value;

use crate::{Dm, body};

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_a_start_line_and_metrics_on_both_processes() {
    let mut opts = StackOptions::default();
    for env in [&mut opts.surface_env, &mut opts.agent_env] {
        env.insert("LOG_FORMAT".into(), "json".into());
    }
    let dm = Dm::start(opts).await;
    let (_, reply) = dm.ask("help").await;
    assert!(body(&reply).contains("send <path>"), "{reply}");

    // Every line is a JSON object, but the recovery key's banner: written once to stderr for
    // the operator, deliberately not a log event (log collectors must not keep it).
    let parse = |log: &str, who: &str| -> Vec<Value> {
        let mut in_banner = false;
        log.lines()
            .filter(|l| {
                if l.contains("RECOVERY KEY (shown once)") {
                    in_banner = true;
                } else if in_banner && l.starts_with("=====") {
                    in_banner = false;
                    return false;
                }
                !in_banner && !l.trim().is_empty()
            })
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{who}: not JSON ({e}): {l}"))
            })
            .collect()
    };
    let surface = parse(&dm.stack.surface.log(), "surface");
    let agent = parse(&dm.stack.agent.log(), "agent");
    let start = |lines: &[Value], message: &str| -> Value {
        lines
            .iter()
            .find(|l| l["fields"]["message"] == message)
            .cloned()
            .unwrap_or_else(|| panic!("no {message:?} line"))
    };
    let s = start(&surface, "surface starting");
    assert_eq!(s["level"], "INFO");
    assert_eq!(s["fields"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["fields"]["user_id"], dm.stack.bot.user_id.as_str());
    let a = start(&agent, "agent started");
    assert_eq!(a["fields"]["brain"], "builtin");
    assert_eq!(a["fields"]["version"], env!("CARGO_PKG_VERSION"));

    for (who, lines) in [("surface", &surface), ("agent", &agent)] {
        let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
        assert!(
            errors.is_empty(),
            "{who} logged errors in a normal run: {errors:?}"
        );
        let text = serde_json::to_string(lines).unwrap();
        for secret in [&dm.stack.agent_token, &dm.stack.bot.password] {
            assert!(!text.contains(secret.as_str()), "{who} logged a secret");
        }
    }

    let m = dm.stack.surface_metrics().await.expect("surface /metrics");
    assert!(
        m.contains("# TYPE mxbridge_surface_events_total counter"),
        "{m}"
    );
    assert!(
        e2e::metric(
            &m,
            "mxbridge_surface_events_total",
            &[("kind", "message"), ("outcome", "trigger")]
        ) >= 1.0,
        "{m}"
    );
    let a = dm.stack.agent_metrics().await.expect("agent /metrics");
    assert!(
        a.contains("mxbridge_agent_turn_duration_seconds_bucket"),
        "{a}"
    );
    assert!(
        e2e::metric(
            &a,
            "mxbridge_agent_tool_calls_total",
            &[("tool", "unknown"), ("outcome", "ok")]
        ) == 0.0
    );
}
