//! Our ACP client against the reference implementation: the official Python SDK's own example
//! agent (`examples/echo_agent.py` of PyPI `agent-client-protocol`, unchanged), so the client is
//! checked against what the protocol's authors ship, not only against itself. scripts/test.sh
//! sets `MXBRIDGE_ACP_PYTHON` (a Python with the SDK) and `MXBRIDGE_ACP_SDK_EXAMPLES` (the
//! examples of its source distribution); without them the test says so and is skipped.

use std::path::PathBuf;

use agent::config::{AcpConfig, BrainConfig};
use protocol::{AttachmentInfo, EndStatus};

use crate::support::*;

fn sdk() -> Option<(PathBuf, PathBuf)> {
    let python = std::env::var_os("MXBRIDGE_ACP_PYTHON").filter(|p| !p.is_empty());
    let examples = std::env::var_os("MXBRIDGE_ACP_SDK_EXAMPLES").filter(|p| !p.is_empty());
    match (python, examples) {
        (Some(p), Some(e)) => Some((p.into(), e.into())),
        _ => {
            eprintln!(
                "skipped: set MXBRIDGE_ACP_PYTHON and MXBRIDGE_ACP_SDK_EXAMPLES (scripts/test.sh does)"
            );
            None
        }
    }
}

#[tokio::test]
async fn the_python_sdks_echo_agent_answers_through_our_client() {
    let Some((python, examples)) = sdk() else {
        return;
    };
    let script = examples.join("echo_agent.py");
    assert!(script.exists(), "{} exists", script.display());
    let brain = BrainConfig::Acp(AcpConfig::new(
        python.display().to_string(),
        vec![script.display().to_string()],
    ));
    let with_brain = |b: BrainConfig| move |c: &mut agent::config::Config| c.brain = b;
    let agent = TestAgent::start_with(with_brain(brain.clone())).await;
    let (mut c, _) = agent.connect(&chat()).await;

    let t = c.turn(message(1, "$1", "hello, reference agent")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    assert_eq!(t.text(), "hello, reference agent");

    // A second turn goes to the same session; an attachment travels as a resource link
    // (which the echo agent echoes as nothing), and the text still comes back whole.
    let path = write(
        agent.workspace.path(),
        &format!("{}/a.txt", inbox(ROOM)),
        b"abc",
    );
    let mut m = message(2, "$2", "and a file");
    m.attachments = vec![path.clone()];
    m.attachment_info.insert(
        path,
        AttachmentInfo {
            name: "a.txt".to_owned(),
            mime: "text/plain".to_owned(),
            size: 3,
            duration_ms: None,
            voice: false,
            inode: None,
        },
    );
    let t = c.turn(m).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    assert_eq!(t.text(), "and a file");
    drop(c);

    // The echo agent cannot resume a session (no `loadSession`): after a restart its new
    // session starts from a summary of the chat (which it echoes), and the room is told once.
    let mut agent = agent;
    agent.restart_with(with_brain(brain)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(3, "$3", "still there?")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    let text = t.text();
    assert!(
        text.contains("hello, reference agent") && text.ends_with("still there?"),
        "the summary, then the message: {text}"
    );
    assert_eq!(
        t.notices()
            .iter()
            .filter(|n| n.contains("working memory of this chat was reset"))
            .count(),
        1,
        "{:?}",
        t.notices()
    );
    let t = c.turn(message(4, "$4", "and now?")).await;
    assert_eq!(t.text(), "and now?", "the summary is given once");
    assert!(t.notices().is_empty(), "{:?}", t.notices());
}
