//! Messages that arrived before their room key. They are journaled as *waiting* in their place
//! in the room order, and their chat's lane stops there. This task decrypts them again whenever
//! room keys arrive (sent, forwarded or downloaded from the key backup, which matrix-sdk fetches
//! when a decryption fails) and then treats them like any message. When the key does not come in
//! `SURFACE_KEY_WAIT`, the room is told who sent what when, the lane goes on, and the message is
//! still answered if its key turns up later (within [`LATE_HORIZON`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use futures_util::StreamExt;
use matrix_sdk::Room;
use matrix_sdk::ruma::OwnedEventId;
use matrix_sdk::ruma::events::room::encrypted::OriginalSyncRoomEncryptedEvent;
use matrix_sdk::ruma::serde::Raw;
use tracing::{debug, error, info, warn};

use crate::context::Ctx;
use crate::inbound::{self, Inbound};
use crate::ingest::{self, Pokes, RoomFacts};
use crate::journal::{ChatRef, NewEvent, Stored, Undecrypted};
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing};

/// How often waiting events are tried again without news of a key (keys from the backup and
/// missed key notifications are found this way).
const RETRY_EVERY: Duration = Duration::from_secs(2);
/// How long the notice about an unreadable message may hold its chat up.
const NOTICE_WAIT: Duration = Duration::from_secs(30);
/// How long a late message is still decrypted and answered once its key arrives.
pub const LATE_HORIZON: Duration = Duration::from_secs(24 * 3600);

/// What to do about an event whose key is still missing (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep its place; try again later.
    KeepWaiting,
    /// The wait is over: tell the room, let the lane go on, keep trying.
    GiveUp,
    /// Too old to answer even if the key came now.
    Forget,
}

/// Decides for an event that has waited `waited` for its key (`late`: already given up).
pub fn verdict(late: bool, waited: Duration, key_wait: Duration) -> Verdict {
    match (late, waited) {
        (false, w) if w >= key_wait => Verdict::GiveUp,
        (true, w) if w >= LATE_HORIZON => Verdict::Forget,
        _ => Verdict::KeepWaiting,
    }
}

/// Runs until shutdown: tries waiting events again on every key that arrives, and every
/// [`RETRY_EVERY`].
pub async fn run(ctx: Ctx) {
    let mut keys = match ctx.client.encryption().room_keys_received_stream().await {
        Some(s) => s.boxed(),
        None => futures_util::stream::pending().boxed(),
    };
    let giving_up = GivingUp::default();
    loop {
        sweep(&ctx, &giving_up).await;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            k = keys.next() => if k.is_none() {
                keys = futures_util::stream::pending().boxed();
            },
            _ = tokio::time::sleep(RETRY_EVERY) => {}
        }
    }
}

/// One pass over every event still waiting for its key.
async fn sweep(ctx: &Ctx, giving_up: &GivingUp) {
    let waiting = match ctx.journal.undecrypted() {
        Ok(w) => w,
        Err(e) => {
            error!(error = %e, "journal read failed");
            return;
        }
    };
    let mut pokes = Pokes::new();
    for u in waiting {
        let ev = &u.journaled.event;
        let Some(room) = ctx.client.get_room(&ev.room_id) else {
            continue;
        };
        match decrypt(&room, ev).await {
            Some(clear) => resolve(ctx, &room, &u, &clear, &mut pokes).await,
            None => {
                let since = u.recorded_ms.max(ctx.started_ms);
                let waited = Duration::from_millis(ingest::now_ms().saturating_sub(since));
                match verdict(u.late, waited, ctx.config.key_wait) {
                    Verdict::KeepWaiting => {}
                    Verdict::GiveUp => give_up(ctx, &room, ev, giving_up),
                    Verdict::Forget => {
                        warn!(room_id = %ev.room_id, event_id = %ev.event_id, "room key never arrived; message dropped after a day");
                        if let Err(e) = ctx.journal.mark_handled(ev.event_id.as_str()) {
                            error!(error = %e, "journal write failed");
                        }
                    }
                }
            }
        }
    }
    ingest::wake(ctx, pokes);
}

/// The clear-text event, if its key is there now.
async fn decrypt(room: &Room, ev: &NewEvent) -> Option<Inbound> {
    let Some(Stored::Encrypted { json }) = ev.content.clone() else {
        return None;
    };
    let raw = Raw::<OriginalSyncRoomEncryptedEvent>::from_json_string(json).ok()?;
    match room.decrypt_event(&raw, None).await {
        Ok(t) if !t.kind.is_utd() => Inbound::parse(&t),
        Ok(_) => None,
        Err(e) => {
            debug!(event_id = %ev.event_id, error = %e, "decryption attempt failed");
            None
        }
    }
}

async fn resolve(ctx: &Ctx, room: &Room, u: &Undecrypted, clear: &Inbound, pokes: &mut Pokes) {
    let facts = RoomFacts::read(ctx, room).await;
    let (row, decision) = ingest::classify(ctx, room, &facts, clear).await;
    match ctx.journal.resolve_undecrypted(&row) {
        Ok(true) => {
            metrics::counter!(crate::metrics::RECOVERED).increment(1);
            info!(
                room_id = %row.room_id,
                event_id = %row.event_id,
                late = u.late,
                disposition = ?row.disposition,
                "decrypted after its room key arrived"
            );
            // A lane that stopped at it goes on (also when it turned out to be nothing to do).
            if let Some(chat) = &u.journaled.event.chat_id {
                pokes.entry(chat.clone()).or_insert_with(|| ChatRef {
                    chat_id: chat.clone(),
                    room_id: row.room_id.clone(),
                    thread_root: u.journaled.event.thread_root.clone(),
                });
            }
            ingest::act(ctx, &row, decision, clear, pokes);
        }
        Ok(false) => {}
        Err(e) => error!(error = %e, "journal write failed; will try again"),
    }
}

/// Events whose give-up (the notice, then letting the lane go on) is under way.
type GivingUp = Arc<Mutex<HashSet<OwnedEventId>>>;

/// The wait is over: the room hears about the message it cannot read, then its lane goes on
/// (so the notice comes before the answers to later messages; a homeserver in trouble holds
/// the lane up for at most [`NOTICE_WAIT`]).
fn give_up(ctx: &Ctx, room: &Room, ev: &NewEvent, giving_up: &GivingUp) {
    if !giving_up
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ev.event_id.clone())
    {
        return;
    }
    let session_id = match &ev.content {
        Some(Stored::Encrypted { json }) => inbound::session_id_of(json).unwrap_or_default(),
        _ => String::new(),
    };
    warn!(
        room_id = %ev.room_id,
        event_id = %ev.event_id,
        sender = %ev.sender,
        session_id = %session_id,
        waited_s = ctx.config.key_wait.as_secs(),
        "room key did not arrive in time; telling the room and answering later messages"
    );
    let text = notice_text(ev.sender_name.as_deref(), ev.sender.as_str(), ev.origin_ts);
    let (ctx, room, ev, giving_up) = (ctx.clone(), room.clone(), ev.clone(), giving_up.clone());
    ctx.tracker.clone().spawn(async move {
        let posted = tokio::time::timeout(
            NOTICE_WAIT,
            post_notice(
                &ctx,
                &room,
                ev.event_id.clone(),
                ev.thread_root.clone(),
                &text,
            ),
        )
        .await;
        if posted.is_err() {
            warn!(event_id = %ev.event_id, "the undecryptable-message notice is slow; the chat goes on");
        }
        match ctx.journal.mark_late(ev.event_id.as_str()) {
            Ok(_) => {
                let mut pokes = Pokes::new();
                if let Some(chat) = &ev.chat_id {
                    pokes.insert(
                        chat.clone(),
                        ChatRef {
                            chat_id: chat.clone(),
                            room_id: ev.room_id.clone(),
                            thread_root: ev.thread_root.clone(),
                        },
                    );
                }
                ingest::wake(&ctx, pokes);
            }
            Err(e) => error!(error = %e, "journal write failed; will try again"),
        }
        giving_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ev.event_id);
    });
}

async fn post_notice(
    ctx: &Ctx,
    room: &Room,
    event_id: OwnedEventId,
    thread_root: Option<OwnedEventId>,
    text: &str,
) {
    let txn = render::notice_txn_id(event_id.as_str(), Purpose::Undecryptable);
    let target = ReplyTarget {
        event_id: event_id.clone(),
        thread_root,
    };
    let out = Outgoing {
        txn: &txn,
        thread_root: Some(target.root()),
        about: Some(&event_id),
        purpose: Purpose::Undecryptable,
    };
    if let Err(e) = send::post(ctx, room, target.notice(text), out).await {
        warn!(event_id = %event_id, error = %e, "could not post the undecryptable-message notice");
    }
}

/// "🔒 I could not decrypt the message Alice (@alice:hs) sent at 2026-11-22 20:51:03 UTC…"
pub fn notice_text(sender_name: Option<&str>, sender: &str, origin_ts: u64) -> String {
    let who = match sender_name {
        Some(name) if name != sender => format!("{name} ({sender})"),
        _ => sender.to_owned(),
    };
    let when = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(origin_ts))
        .to_string()
        .replace('T', " ")
        .replace('Z', " UTC");
    format!(
        "🔒 I could not decrypt the message {who} sent at {when}: its encryption key has not \
         reached me. I will answer it if the key still arrives; otherwise please send it again."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let wait = Duration::from_secs(60);
        let s = Duration::from_secs;
        let table = [
            (false, s(0), Verdict::KeepWaiting),
            (false, s(59), Verdict::KeepWaiting),
            (false, s(60), Verdict::GiveUp),
            (false, s(90_000), Verdict::GiveUp),
            (true, s(61), Verdict::KeepWaiting),
            (true, LATE_HORIZON, Verdict::Forget),
        ];
        for (late, waited, expected) in table {
            assert_eq!(verdict(late, waited, wait), expected, "{late} {waited:?}");
        }
    }

    #[test]
    fn the_notice_names_sender_and_time() {
        let t = notice_text(Some("Alice"), "@alice:hs", 1_700_000_000_000);
        assert!(t.contains("Alice (@alice:hs)"), "{t}");
        assert!(t.contains("2023-11-14 22:13:20 UTC"), "{t}");
        let t = notice_text(None, "@alice:hs", 0);
        assert!(
            t.contains("message @alice:hs sent at 1970-01-01 00:00:00 UTC"),
            "{t}"
        );
    }
}
