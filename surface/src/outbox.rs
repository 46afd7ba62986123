//! Watches every room's `outbox/` folder and reports files dropped there once they are complete.
//!
//! A file counts as complete when the writer closes it (`IN_CLOSE_WRITE`) or when it is renamed
//! or moved into the folder (the atomic way to drop a file). Dotfiles (temporary names, the
//! `.sent/` and `.failed/` folders) and anything deeper than `outbox/<name>` are ignored. At
//! start, files already present are reported too, so nothing dropped while the surface was down
//! is lost.
//!
//! Only the folders on the way to an outbox are watched, each on its own ([`place`]):
//! `surfaces/matrix`, every `<user>/`, every `<user>/<room>/` and every `<room>/outbox/`. A new
//! one is watched as soon as it appears (by a thread of its own: the watch cannot be changed from
//! inside its own event handler) and then looked through, so nothing dropped into it before its
//! watch is missed. The inboxes are not watched: a download writes a file there in thousands of
//! pieces, and a recursive watch woke this process once for every piece. After posting, the runtime moves each file aside with
//! [`crate::workspace::Workspace::move_aside`].

use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecursiveMode, Watcher};
use protocol::{WorkspacePath, matrix_id_component, surface_root};
use tokio::sync::mpsc;

/// How long a reported file is remembered, so one drop is not reported twice (a scan racing
/// an event, a file closed twice).
const DEDUP_WINDOW: Duration = Duration::from_secs(600);

/// A complete file in `surfaces/matrix/<user>/<room>/outbox/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    /// The `<user>` folder name (a [`matrix_id_component`] of a user id).
    pub user_component: String,
    /// The `<room>` folder name; see [`room_component_matches`].
    pub room_component: String,
    /// The file, relative to the workspace.
    pub path: WorkspacePath,
}

/// Whether `component` is the folder name of `room_id`.
pub fn room_component_matches(room_id: &str, component: &str) -> bool {
    matrix_id_component(room_id) == component
}

/// Why the watcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// `surfaces/matrix` could not be created.
    #[error("could not create {}: {source}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// inotify (or the platform's watcher) refused.
    #[error("could not watch the outboxes: {0}")]
    Watch(#[from] notify::Error),
}

/// Keeps the watch alive; dropping it stops watching.
pub struct OutboxWatcher {
    orders: std::sync::mpsc::Sender<Order>,
    #[cfg(test)]
    reporter: Arc<Reporter>,
    root: PathBuf,
}

impl fmt::Debug for OutboxWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxWatcher")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Drop for OutboxWatcher {
    fn drop(&mut self) {
        // The watching thread ends, and the watch with it.
        let _ = self.orders.send(Order::Stop);
    }
}

impl OutboxWatcher {
    /// Events the watch has delivered so far (for tests).
    #[cfg(test)]
    fn events_seen(&self) -> u64 {
        self.reporter
            .events
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Starts watching `<ws_root>/surfaces/matrix` (creating it if needed) down to every room's
/// outbox and sends an [`OutboxItem`] on `tx` for each complete file dropped into a room's
/// outbox, plus one for each file already there. Sending blocks the watcher thread while `tx` is
/// full (back-pressure); if the receiver is gone, items are dropped.
///
/// The paths are reported, not trusted: the runtime opens them with
/// [`crate::workspace::Workspace::open_for_upload`] like any other file.
pub fn watch_outboxes(
    ws_root: PathBuf,
    tx: mpsc::Sender<OutboxItem>,
) -> Result<OutboxWatcher, OutboxError> {
    let base = ws_root.join(surface_root().as_path());
    std::fs::create_dir_all(&base).map_err(|source| OutboxError::CreateDir {
        path: base.clone(),
        source,
    })?;
    let reporter = Arc::new(Reporter {
        base: base.clone(),
        tx,
        seen: Mutex::new(HashMap::new()),
        events: std::sync::atomic::AtomicU64::new(0),
    });
    let (orders, to_do) = std::sync::mpsc::channel();
    let handler_state = Arc::clone(&reporter);
    let handler_orders = orders.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| match res {
        Ok(event) => handler_state.on_event(&event, |dir| {
            let _ = handler_orders.send(Order::Adopt(dir));
        }),
        Err(e) => tracing::warn!(error = %e, "outbox watcher error"),
    })?;
    watcher.watch(&base, RecursiveMode::NonRecursive)?;
    // The rest of the tree, and the files already there, on the watching thread: sending may
    // block, and the watch is changed there from now on.
    let _ = orders.send(Order::Adopt(base));
    let state = Arc::clone(&reporter);
    std::thread::Builder::new()
        .name("outbox-watch".into())
        .spawn(move || {
            while let Ok(Order::Adopt(dir)) = to_do.recv() {
                state.adopt(&mut watcher, &dir);
            }
        })
        .map_err(|e| OutboxError::Watch(notify::Error::io(e)))?;
    Ok(OutboxWatcher {
        orders,
        #[cfg(test)]
        reporter,
        root: ws_root,
    })
}

/// What the watching thread is asked to do.
enum Order {
    /// Watch this folder (if [`place`] says so), and what is below it, and report the files in
    /// it.
    Adopt(PathBuf),
    /// Stop watching.
    Stop,
}

/// Where a folder is, seen from `surfaces/matrix`: the folders that lead to an outbox are
/// watched, nothing else is (an inbox, `.sent/`, anything deeper or hidden).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// `surfaces/matrix` itself.
    Base,
    /// `<user>/`.
    User,
    /// `<user>/<room>/`.
    Room,
    /// `<user>/<room>/outbox/`.
    Outbox,
    /// Anything else.
    Unwatched,
}

/// Where `dir` is under `base` (pure).
fn place(base: &Path, dir: &Path) -> Place {
    let Ok(rel) = dir.strip_prefix(base) else {
        return Place::Unwatched;
    };
    let parts: Option<Vec<&str>> = rel
        .components()
        .map(|c| match c {
            std::path::Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let Some(parts) = parts else {
        return Place::Unwatched;
    };
    if parts.iter().any(|p| p.starts_with('.')) {
        return Place::Unwatched;
    }
    match parts.as_slice() {
        [] => Place::Base,
        [_] => Place::User,
        [_, _] => Place::Room,
        [_, _, "outbox"] => Place::Outbox,
        _ => Place::Unwatched,
    }
}

/// (device, inode, size, mtime seconds, mtime nanoseconds): the same file, unchanged.
type FileIdentity = (u64, u64, u64, i64, i64);

struct Reporter {
    /// `<ws_root>/surfaces/matrix`.
    base: PathBuf,
    tx: mpsc::Sender<OutboxItem>,
    /// Reported files by identity (dev, inode, size, mtime) → when.
    seen: Mutex<HashMap<FileIdentity, Instant>>,
    /// Events delivered by the watch.
    events: std::sync::atomic::AtomicU64,
}

impl Reporter {
    /// Handles one event of the watch; `adopt` asks the watching thread to watch a new folder.
    fn on_event(&self, event: &Event, adopt: impl Fn(PathBuf)) {
        self.events
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if event.need_rescan() {
            // The kernel queue overflowed: events were lost, look at everything again.
            tracing::warn!("outbox watcher lost events; rescanning");
            adopt(self.base.clone());
            return;
        }
        let arrived: &[PathBuf] = match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Any))
            | EventKind::Create(_) => &event.paths,
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                event.paths.get(1..).unwrap_or_default()
            }
            _ => &[],
        };
        let created = matches!(event.kind, EventKind::Create(_));
        for path in arrived {
            let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
            if is_dir {
                // A new folder (an outbox, or a whole user/room tree moved in): files may have
                // landed in it before its watch is added; adopting it looks through it.
                if place(&self.base, path) != Place::Unwatched {
                    adopt(path.clone());
                }
            } else if !created {
                // A file is complete when closed or moved in, not when created.
                self.consider(path);
            }
        }
    }

    /// Watches `dir` if it leads to an outbox, then what is below it, and reports the files of
    /// an outbox.
    fn adopt(&self, watcher: &mut impl Watcher, dir: &Path) {
        let here = place(&self.base, dir);
        if here == Place::Unwatched {
            return;
        }
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            // Gone again, or the kernel's watch limit: the folder's files are still looked at.
            tracing::warn!(path = %dir.display(), error = %e, "could not watch an outbox folder");
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                self.adopt(watcher, &path);
            } else if ft.is_file() && here == Place::Outbox {
                self.consider(&path);
            }
        }
    }

    /// Reports `path` if it is a complete, not yet reported regular file directly in an outbox.
    fn consider(&self, path: &Path) {
        let Some(item) = classify(&self.base, path) else {
            return;
        };
        // Not followed: a symlink dropped in the outbox is refused later by the opener anyway.
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if !meta.file_type().is_file() {
            return;
        }
        let id = (
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
        );
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            seen.retain(|_, t| now.duration_since(*t) < DEDUP_WINDOW);
            if seen.insert(id, now).is_some() {
                return;
            }
        }
        tracing::debug!(path = %item.path, "outbox file ready");
        if self.tx.blocking_send(item).is_err() {
            tracing::debug!("outbox receiver is gone");
        }
    }
}

/// The item for `path` if it is `<base>/<user>/<room>/outbox/<name>` with a visible name.
fn classify(base: &Path, path: &Path) -> Option<OutboxItem> {
    let rel = path.strip_prefix(base).ok()?;
    let parts: Vec<&str> = rel
        .components()
        .map(|c| match c {
            std::path::Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let [user, room, "outbox", name] = parts.as_slice() else {
        return None;
    };
    if name.starts_with('.') || user.starts_with('.') || room.starts_with('.') {
        return None;
    }
    let path = surface_root()
        .join(&format!("{user}/{room}/outbox/{name}"))
        .ok()?;
    Some(OutboxItem {
        user_component: (*user).to_owned(),
        room_component: (*room).to_owned(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::Workspace;

    const USER: &str = "@alice:example.org";
    const ROOM: &str = "!room:example.org";

    async fn next(rx: &mut mpsc::Receiver<OutboxItem>) -> OutboxItem {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an outbox item in time")
            .expect("channel open")
    }

    fn outbox(root: &Path) -> PathBuf {
        let p = Workspace::outbox_dir(USER, ROOM).to_path_under(root);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn classifies_paths() {
        let base = Path::new("/ws/surfaces/matrix");
        let item = classify(base, &base.join("u/r/outbox/a.txt")).unwrap();
        assert_eq!(item.user_component, "u");
        assert_eq!(item.room_component, "r");
        assert_eq!(item.path.as_str(), "surfaces/matrix/u/r/outbox/a.txt");
        for bad in [
            "u/r/outbox/.partial-x",
            "u/r/outbox/.sent/a.txt",
            "u/r/outbox/sub/a.txt",
            "u/r/inbox/a.txt",
            "u/r/outbox",
            "u/outbox/a.txt",
        ] {
            assert!(classify(base, &base.join(bad)).is_none(), "{bad}");
        }
        assert!(classify(base, Path::new("/elsewhere/u/r/outbox/a")).is_none());
        assert!(room_component_matches(ROOM, &matrix_id_component(ROOM)));
        assert!(!room_component_matches(
            "!other:example.org",
            &matrix_id_component(ROOM)
        ));
    }

    #[test]
    fn only_the_folders_leading_to_an_outbox_are_watched() {
        let base = Path::new("/ws/surfaces/matrix");
        let cases = [
            ("", Place::Base),
            ("u", Place::User),
            ("u/r", Place::Room),
            ("u/r/outbox", Place::Outbox),
            ("u/r/inbox", Place::Unwatched),
            ("u/r/outbox/.sent", Place::Unwatched),
            ("u/r/outbox/sub", Place::Unwatched),
            ("u/r/other", Place::Unwatched),
            ("u/outbox", Place::Room),
            (".hidden", Place::Unwatched),
            ("u/.r", Place::Unwatched),
            ("u/.r/outbox", Place::Unwatched),
        ];
        for (rel, want) in cases {
            let dir = if rel.is_empty() {
                base.to_owned()
            } else {
                base.join(rel)
            };
            assert_eq!(place(base, &dir), want, "{rel:?}");
        }
        assert_eq!(place(base, Path::new("/ws/surfaces")), Place::Unwatched);
        assert_eq!(place(base, Path::new("/elsewhere/u")), Place::Unwatched);
        assert_eq!(place(base, &base.join("u/../v")), Place::Unwatched);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_download_into_an_inbox_does_not_wake_the_watcher() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let outbox = outbox(&root);
        let inbox = Workspace::inbox_dir(USER, ROOM).to_path_under(&root);
        std::fs::create_dir_all(&inbox).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let watcher = watch_outboxes(root.clone(), tx).unwrap();
        // The watch is in place once a file dropped now is reported.
        std::fs::write(outbox.join("first.txt"), b"1").unwrap();
        assert_eq!(next(&mut rx).await.path.file_name(), "first.txt");
        let before = watcher.events_seen();

        // A download: a file written in 500 pieces, then renamed into place.
        let partial = inbox.join(".partial-x");
        let mut f = std::fs::File::create(&partial).unwrap();
        for _ in 0..500 {
            f.write_all(&[7u8; 4096]).unwrap();
        }
        drop(f);
        std::fs::rename(&partial, inbox.join("photo.jpg")).unwrap();
        // Then a file in the outbox, to know the watch has caught up.
        std::fs::write(outbox.join("second.txt"), b"2").unwrap();
        assert_eq!(next(&mut rx).await.path.file_name(), "second.txt");
        let during = watcher.events_seen() - before;
        // A watch on the inbox would see at least one event per write: 500. What is seen
        // instead is the outbox files' own events (create, open, write, close) and, when the
        // start's scan raced the first file, that file's events and the scan's folder opens
        // arriving late: a dozen at most (11 seen once in CI, where 10 was the bound).
        assert!(during < 50, "{during} events for 500 writes in an inbox");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_complete_files_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let outbox = outbox(&root);
        // Present before the watcher starts: reported by the initial scan.
        std::fs::write(outbox.join("early.txt"), b"early").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let _watcher = watch_outboxes(root.clone(), tx).unwrap();
        let item = next(&mut rx).await;
        assert_eq!(item.path.file_name(), "early.txt");
        assert!(room_component_matches(ROOM, &item.room_component));

        // A temp file (ignored) renamed into place (reported once).
        std::fs::write(outbox.join(".tmp-upload"), b"renamed").unwrap();
        std::fs::rename(outbox.join(".tmp-upload"), outbox.join("renamed.txt")).unwrap();
        let item = next(&mut rx).await;
        assert_eq!(item.path.file_name(), "renamed.txt");

        // Moved in from outside the outbox.
        std::fs::write(root.join("outside.txt"), b"moved").unwrap();
        std::fs::rename(root.join("outside.txt"), outbox.join("moved.txt")).unwrap();
        let item = next(&mut rx).await;
        assert_eq!(item.path.file_name(), "moved.txt");

        // Written and closed.
        std::fs::write(outbox.join("written.txt"), b"written").unwrap();
        let item = next(&mut rx).await;
        assert_eq!(item.path.file_name(), "written.txt");

        // Moving aside (into `.sent/`) reports nothing; a new room's outbox is picked up.
        let ws = Workspace::open(&root).unwrap();
        ws.move_aside(&item.path, crate::workspace::Outcome::Sent)
            .unwrap();
        let other = Workspace::outbox_dir(USER, "!new:example.org").to_path_under(&root);
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("new-room.txt"), b"x").unwrap();
        let item = next(&mut rx).await;
        assert_eq!(item.path.file_name(), "new-room.txt");
        assert!(room_component_matches(
            "!new:example.org",
            &item.room_component
        ));

        // Nothing else (no duplicates) arrived meanwhile.
        assert!(rx.try_recv().is_err());
    }
}
