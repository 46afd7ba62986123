//! `surface doctor`: answers "the bot is connected but silent — why?". It checks the
//! configuration, the homeserver, the login, the joined rooms and allowlists, encryption
//! (cross-signing, key backup), the agent link and shared workspace, a running surface and its
//! journal, and for `--room` (and `--sender`) says whether a message there would be answered,
//! using the same decision the surface makes. One line per finding; exit 0, or 1 when
//! something fails.
//!
//! Decide, then do: [`probe`] gathers observations, [`findings`] (pure) judges them.

mod findings;
mod login;
mod probe;

pub use findings::{
    CrossSigning, Finding, Level, Login, Observations, RoomObservation, WaysIn, exit_code,
};

use crate::config::Config;

/// Runs every check and returns the findings in reading order.
pub async fn examine(config: &Config, room: Option<&str>, sender: Option<&str>) -> Vec<Finding> {
    let observations = probe::observe(config, room, sender).await;
    findings::findings(config, &observations)
}
