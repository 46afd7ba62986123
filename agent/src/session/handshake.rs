//! The opening of a connection: `hello` within the handshake timeout in a version this agent
//! speaks, then the workspace sentinels both ways, so each side can tell whether the two
//! processes see the same workspace.

use protocol::{
    ChatId, ErrorCode, Hello, PROTOCOL_VERSION, Sentinel, ToAgent, Welcome, WorkspaceCheck,
    WorkspacePath,
};
use tracing::{error, info, info_span, warn};

use crate::chat::Chat;
use crate::config::Limits;
use crate::confine::Workspace;
use crate::connection::{CloseReason, Connection, Outbox};
use crate::link::new_id;

/// Waits for `hello` and checks its version. `None` (after telling the peer) if it fails.
pub(super) async fn handshake(
    conn: &mut Connection,
    out: &Outbox,
    limits: &Limits,
) -> Option<Hello> {
    let (code, message) = match conn.recv_within(limits.handshake_timeout).await {
        Ok(Some(ToAgent::Hello(hello))) if hello.protocol_version == PROTOCOL_VERSION => {
            return Some(hello);
        }
        Ok(Some(ToAgent::Hello(hello))) => (
            ErrorCode::UnsupportedVersion,
            format!(
                "protocol version {} is not supported; this agent speaks {PROTOCOL_VERSION}",
                hello.protocol_version
            ),
        ),
        Ok(Some(_)) => (
            ErrorCode::BadHandshake,
            "the first message must be hello".to_owned(),
        ),
        Ok(None) => return None,
        Err(_) => (
            ErrorCode::BadHandshake,
            format!("no hello within {:?}", limits.handshake_timeout),
        ),
    };
    warn!(?code, %message, "handshake failed");
    let _ = out.error(code, message).await;
    out.close(CloseReason::Protocol).await;
    None
}

/// Answers `hello` with `welcome`: the chat's last stored sequence number, the workspace
/// check and the models a room may choose. `false` if the connection is already gone.
pub(super) async fn welcome(
    workspace: &Workspace,
    chat: &Chat,
    out: &Outbox,
    hello: Hello,
    models: Vec<String>,
) -> bool {
    info!(surface = %hello.surface, "handshake");
    let workspace = check_workspace(workspace, &chat.id, hello.workspace_sentinel).await;
    let last_seq = match chat.last_seq().await {
        Ok(last_seq) => last_seq,
        Err(e) => {
            // Without it the surface cannot know what to resend: it reconnects and asks again.
            error!(error = %e, "cannot read the chat's last sequence number");
            out.refuse_unreadable_state().await;
            return false;
        }
    };
    let welcome = Welcome {
        protocol_version: PROTOCOL_VERSION,
        agent: env!("CARGO_PKG_NAME").to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        last_seq,
        workspace,
        models,
    };
    out.send(&welcome.into()).await.is_ok()
}

/// Checks the surface's sentinel and writes the agent's own, so each side can prove the two
/// processes see the same workspace.
async fn check_workspace(
    workspace: &Workspace,
    chat: &ChatId,
    sentinel: Option<Sentinel>,
) -> WorkspaceCheck {
    let workspace = workspace.clone();
    let chat = chat.clone();
    let span = info_span!("workspace_check");
    tokio::task::spawn_blocking(move || {
        let _enter = span.enter();
        let surface_sentinel_ok = sentinel.map(|s| {
            let allowed =
                WorkspacePath::new("surfaces/matrix/.sentinel").expect("constant is valid");
            let ok = s.path.starts_with(&allowed)
                && workspace
                    .read_prefix(&s.path, 4096)
                    .is_ok_and(|(bytes, _)| bytes == s.nonce.as_bytes());
            if ok {
                info!(path = %s.path, "surface sentinel found: the workspace is shared");
            } else {
                error!(
                    path = %s.path,
                    "WORKSPACE MISMATCH: the surface's sentinel file is missing or different here; \
                     the surface and the agent do not see the same workspace"
                );
            }
            ok
        });
        let nonce = new_id("agent");
        let agent_sentinel = WorkspacePath::new(format!("chats/.sentinel/{chat}"))
            .ok()
            .and_then(|path| match workspace.write_file(&path, nonce.as_bytes()) {
                Ok(()) => Some(Sentinel { path, nonce }),
                Err(e) => {
                    error!(error = %e, "cannot write the agent's workspace sentinel");
                    None
                }
            });
        WorkspaceCheck {
            surface_sentinel_ok,
            agent_sentinel,
        }
    })
    .await
    .unwrap_or(WorkspaceCheck {
        surface_sentinel_ok: Some(false),
        agent_sentinel: None,
    })
}
