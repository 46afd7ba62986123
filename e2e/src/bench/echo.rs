//! The echo bot every bot figure is compared with: a matrix-sdk client on the same homeserver
//! that joins every invite and answers every message of someone else with a reply, straight
//! from its sync loop. The floor any bot can reach here.

use matrix_sdk::Room;
use matrix_sdk::ruma::events::relation::{InReplyTo, Reply};
use matrix_sdk::ruma::events::room::member::{MembershipState, StrippedRoomMemberEvent};
use matrix_sdk::ruma::events::room::message::{
    OriginalSyncRoomMessageEvent, Relation, RoomMessageEventContent,
};

use crate::E2eeUser;

/// Makes `bot` an echo bot (until it is dropped).
pub fn serve(bot: &E2eeUser) {
    let me = bot.user_id.clone();
    bot.client()
        .add_event_handler(move |ev: StrippedRoomMemberEvent, room: Room| {
            let me = me.clone();
            async move {
                if ev.state_key.as_str() == me && ev.content.membership == MembershipState::Invite {
                    let _ = room.join().await;
                }
            }
        });
    let me = bot.user_id.clone();
    bot.client()
        .add_event_handler(move |ev: OriginalSyncRoomMessageEvent, room: Room| {
            let me = me.clone();
            async move {
                if ev.sender.as_str() == me {
                    return;
                }
                let mut content = RoomMessageEventContent::text_plain("echo");
                content.relates_to = Some(Relation::Reply(Reply::new(InReplyTo::new(
                    ev.event_id.clone(),
                ))));
                // Sent beside the sync loop, so a burst is answered concurrently, as a bot
                // that does not wait for one reply before the next would.
                tokio::spawn(async move {
                    let _ = room.send(content).await;
                });
            }
        });
}
