//! What the bot tells a room about itself: its commands as MSC4391 command descriptions in the
//! room's state ([`publish_commands`], where its power level allows; a description already
//! there unchanged is not sent again), and, in a room it has just joined, one short
//! introduction ([`introduce`], unless `SURFACE_JOIN_INTRO=off`; once per room, also across
//! restarts: its transaction id is the room's).

use std::time::Duration;

use matrix_sdk::Room;
use matrix_sdk::ruma::events::StateEventType;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use tracing::{debug, info, warn};

use crate::command::{self, DESCRIPTION_TYPE};
use crate::context::Ctx;
use crate::purpose::Purpose;
use crate::render;
use crate::room_settings;
use crate::send::{self, Outgoing};

/// How long a room just joined may take to show its state (power levels) to the client.
const STATE_WAIT: Duration = Duration::from_secs(20);

/// Publishes the bot's command descriptions in `room`, if the bot may send them there.
/// Returns how many were sent (0 when all were there already, or the bot may not).
pub async fn publish_commands(ctx: &Ctx, room: &Room) -> usize {
    let bot = &ctx.config.user_id;
    let room_id = room.room_id();
    let levels = match room.power_levels().await {
        Ok(levels) => levels,
        Err(e) => {
            debug!(room_id = %room_id, error = %e, "power levels unknown; commands not published");
            return 0;
        }
    };
    if !levels.user_can_send_state(bot, StateEventType::from(DESCRIPTION_TYPE)) {
        debug!(room_id = %room_id, "the bot may not describe its commands here");
        return 0;
    }
    let mut sent = 0;
    for (word, content) in command::descriptions() {
        let key = command::state_key(word, bot.as_str());
        if room_settings::state_content(room, DESCRIPTION_TYPE, &key)
            .await
            .as_ref()
            == Some(&content)
        {
            continue;
        }
        match room
            .send_state_event_raw(DESCRIPTION_TYPE, &key, content)
            .await
        {
            Ok(_) => sent += 1,
            Err(e) => {
                warn!(room_id = %room_id, command = word, error = %e, "could not publish a command description");
                return sent;
            }
        }
    }
    if sent > 0 {
        info!(room_id = %room_id, sent, "command descriptions published (MSC4391)");
    }
    sent
}

/// The introduction of the bot in a room of `members` joined members (pure).
pub fn intro_text(members: u64, bot_user_id: &str) -> String {
    if members <= 2 {
        "👋 Hi! Send me a message or a file and I answer in a thread. `!stop` stops an answer \
         being written, `!settings` shows this room's settings, `!help` lists my commands."
            .to_owned()
    } else {
        format!(
            "👋 Hi! Mention me ({}) to talk to me; I answer in a thread, and there you can go on \
             without mentioning me. `!settings` shows this room's settings (moderators change \
             them, e.g. `!mode all` to have me answer every message); `!help` lists my commands.",
            render::pill(bot_user_id)
        )
    }
}

/// In a room the bot has just joined: waits for its state, publishes the command descriptions,
/// and posts the introduction (unless turned off).
pub async fn on_join(ctx: &Ctx, room: &Room) {
    let deadline = tokio::time::Instant::now() + STATE_WAIT;
    while room.power_levels().await.is_err() && tokio::time::Instant::now() < deadline {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    publish_commands(ctx, room).await;
    if ctx.config.join_intro {
        introduce(ctx, room).await;
    }
}

/// Posts the introduction in `room`, once per room.
async fn introduce(ctx: &Ctx, room: &Room) {
    let room_id = room.room_id();
    let members = room.joined_members_count().max(1);
    let text = intro_text(members, ctx.config.user_id.as_str());
    let txn = render::notice_txn_id(&format!("intro:{room_id}"), Purpose::Intro);
    let out = Outgoing {
        txn: &txn,
        thread_root: None,
        about: None,
        purpose: Purpose::Intro,
    };
    let content = RoomMessageEventContent::notice_markdown(text);
    match tokio::time::timeout(Duration::from_secs(30), send::post(ctx, room, content, out)).await {
        Ok(Ok(id)) => info!(room_id = %room_id, event_id = %id, "introduced in the room"),
        Ok(Err(e)) => warn!(room_id = %room_id, error = %e, "could not post the introduction"),
        Err(_) => warn!(room_id = %room_id, "the introduction took too long; skipped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_introduction_says_how_to_address_the_bot() {
        let dm = intro_text(2, "@bot:hs");
        assert!(dm.contains("`!help`") && !dm.contains("Mention"), "{dm}");
        let group = intro_text(5, "@bot:hs");
        assert!(
            group.contains("Mention me") && group.contains("@bot:hs"),
            "{group}"
        );
        assert!(group.contains("`!mode all`") && group.contains("`!help`"));
        assert!(dm.contains("`!settings`") && group.contains("`!settings`"));
    }
}
