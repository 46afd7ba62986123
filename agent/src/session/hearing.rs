//! Before a turn runs: its recordings are transcribed (once: what was heard is stored with the
//! turn before anything else happens), and the room is shown what was heard, or why nothing
//! was, so that a user can tell a mishearing.

use std::collections::BTreeMap;

use protocol::CustomUpdate;
use tracing::{info, warn};

use crate::chat::Chat;
use crate::confine::ScopedWorkspace;
use crate::link::Link;
use crate::perceive::{Transcriber, heard_line, transcribe::is_audio};
use crate::store::{Perceived, TurnRecord};

/// Most recordings transcribed for one turn; more are left as files.
const MAX_RECORDINGS: usize = 8;

/// Transcribes `turn`'s recordings that have not been (a turn run again after a restart keeps
/// what it heard), stores the result with the turn and tells the room. `waited` is how long
/// the turn waited in the queue: with the time here minus the transcription server's own, it is
/// the agent's share of a voice message's way to its transcript (logged on `mxbridge_latency`
/// as the leg `agent_hear`, for the benchmark).
pub(super) async fn hear(
    transcriber: &Transcriber,
    chat: &Chat,
    link: &Link,
    ws: &ScopedWorkspace,
    turn: &mut TurnRecord,
    waited: std::time::Duration,
) {
    let recordings: Vec<_> = turn
        .attachments
        .iter()
        .filter(|p| !turn.perceived.contains_key(*p))
        .filter_map(|p| {
            turn.attachment_info
                .get(p)
                .map(|info| (p.clone(), info.clone()))
        })
        .filter(|(_, info)| is_audio(info))
        .take(MAX_RECORDINGS)
        .collect();
    if recordings.is_empty() {
        return;
    }
    let started = std::time::Instant::now();
    let mut server = std::time::Duration::ZERO;
    let mut heard = BTreeMap::new();
    for (path, info) in &recordings {
        let perceived = match transcriber.transcribe(ws, path, info).await {
            Ok(t) => {
                server += t.exchange;
                Perceived::Heard { text: t.text }
            }
            Err(e) => {
                warn!(%path, error = %e, failure = e.label(), "recording not transcribed");
                crate::metrics::transcription(e.label());
                Perceived::NotHeard { why: e.to_string() }
            }
        };
        if matches!(perceived, Perceived::Heard { .. }) {
            crate::metrics::transcription("ok");
        }
        heard.insert(path.clone(), perceived);
    }
    turn.perceived.extend(heard.clone());
    if let Err(e) = chat.perceive(&turn.id, turn.perceived.clone()).await {
        // Not fatal: the turn goes on with what was heard; a rerun would transcribe again.
        warn!(error = %e, "could not store what was heard");
    }
    let own = (waited + started.elapsed()).saturating_sub(server);
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    tracing::debug!(target: "mxbridge_latency", leg = "agent_hear", us = us(own));
    // What was subtracted: the transcription server's share.
    tracing::debug!(target: "mxbridge_latency", leg = "agent_hear_server", us = us(server));
    for (path, perceived) in &heard {
        let Some(info) = turn.attachment_info.get(path) else {
            continue;
        };
        let text = match perceived {
            Perceived::Heard { .. } if !transcriber.shows_room() => continue,
            Perceived::Heard { .. } => {
                format!("🎤 {}", heard_line(perceived, info.voice, info.duration_ms))
            }
            Perceived::NotHeard { why } => format!(
                "⚠️ I could not transcribe {}: {why}. I'll go on with the file itself.",
                if info.voice {
                    "the voice message"
                } else {
                    "the audio file"
                }
            ),
        };
        info!(%path, "telling the room what was heard");
        let _ = link.emit(CustomUpdate::notice(&turn.id, text)).await;
    }
}
