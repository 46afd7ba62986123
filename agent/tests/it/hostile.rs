//! Strangers in the chat: the test hooks are off by default.

use protocol::EndStatus;

use crate::support::{TestAgent, chat, message};

#[tokio::test]
async fn test_hooks_are_unknown_commands_by_default() {
    let agent = TestAgent::start_with(|c| c.test_hooks = false).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let help = c.turn(message(1, "$m1", "help")).await;
    assert!(!help.text().contains("sleep"), "{}", help.text());
    assert!(!help.text().contains("sendraw"), "{}", help.text());
    let raw = c
        .turn(message(2, "$m2", "sendraw chats/x/missing.bin"))
        .await;
    assert!(raw.sent_files().is_empty(), "{raw:?}");
    assert!(raw.text().contains("Say `help`"), "{}", raw.text());
    let sleep = c.turn(message(3, "$m3", "sleep 60000")).await;
    assert_eq!(sleep.end().status, EndStatus::Completed);
    assert!(sleep.text().contains("Say `help`"), "{}", sleep.text());
}
