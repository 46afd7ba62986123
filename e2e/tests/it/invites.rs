//! An invite to a room outside `SURFACE_ALLOWED_ROOMS` is declined, and the leave event says
//! why, so the inviter's client shows the reason instead of a bare "declined".

use std::collections::BTreeMap;

use e2e::{Homeserver, Stack, StackOptions, eventually};

use crate::TURN;

#[tokio::test]
async fn an_invite_to_a_room_that_is_not_allowed_is_declined_with_the_reason() {
    let hs = Homeserver::from_env();
    let stack = Stack::start(
        &hs,
        StackOptions {
            surface_env: BTreeMap::from([(
                "SURFACE_ALLOWED_ROOMS".to_owned(),
                "#only-this-one:nowhere.invalid".to_owned(),
            )]),
            ..StackOptions::default()
        },
    )
    .await
    .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let user = hs
        .register(&e2e::unique("inviter"), false)
        .await
        .expect("register");
    let room = user.create_room(&[&bot], false).await.expect("room");
    let member = eventually(TURN, "the bot declines the invite", || async {
        let m = user.state(&room, "m.room.member", &bot).await.ok()?;
        (m["membership"] == "leave").then_some(m)
    })
    .await;
    assert_eq!(
        member["reason"],
        "This bot only joins the rooms its operator allows (SURFACE_ALLOWED_ROOMS).",
        "{member}"
    );
}
