//! Focused integration tests of the surface with fakes (a fake agent on port 0). The
//! real-homeserver tests live in the `e2e` crate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

mod agent_link;
mod doctor;
mod fuzz;
mod health;
mod run;
