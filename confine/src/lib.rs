//! Which workspace files a chat may reach, and how both processes open them: one definition for
//! the agent (tools) and the surface (uploads).
//!
//! * [`ChatScope`] is the pure rule: a chat reaches its own `chats/<chat_id>/` and its room's
//!   `inbox/` and `outbox/` (for any user), never an in-progress download (`.partial-*`).
//! * [`open_file`] and [`open_dir`] open beneath a `cap_std` directory handle one component at a
//!   time without following symlinks; [`open_reachable`] does so only for what a scope reaches
//!   and answers "not found" for anything else. The opened handle must be a regular file with
//!   exactly one link, under the size limit, whose links have not changed since shortly before
//!   the open (so a hard link swapped in and out between open and check is caught).
//! * [`ConfineError`] says why, naming the workspace path only (all opens are relative, so no
//!   host path can appear in it).
//!
//! `protocol` stays pure: the layout and `WorkspacePath` come from there, the I/O is here.

mod error;
mod open;
mod scope;

pub use error::{ConfineError, parse_path};
pub use open::{
    ConfinedFile, create_parent, open_dir, open_file, open_file_as, open_parent, open_reachable,
    open_reachable_as, open_subdir,
};
pub use scope::{ChatScope, PARTIAL_PREFIX, ScopeRoom, is_partial};
