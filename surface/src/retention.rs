//! Removes old inbox files (`SURFACE_INBOX_RETENTION`), and stale temporary downloads.

use std::time::{Duration, SystemTime};

use crate::workspace::{PARTIAL_PREFIX, Workspace};

/// How old a `.partial-*` temporary download must be before a sweep removes it (a download in
/// progress keeps writing, so its mtime stays fresh).
const STALE_PARTIAL: Duration = Duration::from_secs(24 * 3600);

/// What a sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Inbox files removed for being older than the retention.
    pub removed: usize,
    /// Stale temporary downloads removed.
    pub partials_removed: usize,
}

/// Removes regular files in every `surfaces/matrix/<user>/<room>/inbox/` whose mtime is older
/// than `max_age`, and temporary downloads untouched for a day. Never follows symlinks, never
/// descends into subfolders. Runs on a blocking thread.
pub async fn sweep_inboxes(ws: &Workspace, max_age: Duration) -> SweepReport {
    let ws = ws.clone();
    tokio::task::spawn_blocking(move || sweep_now(&ws, max_age, SystemTime::now()))
        .await
        .unwrap_or_default()
}

fn sweep_now(ws: &Workspace, max_age: Duration, now: SystemTime) -> SweepReport {
    let mut report = SweepReport::default();
    ws.for_each_inbox(|inbox, path| {
        let Ok(entries) = inbox.entries() else {
            return;
        };
        for entry in entries.flatten() {
            // `DirEntry::metadata` does not follow symlinks.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let Ok(mtime) = meta.modified() else { continue };
            let age = now
                .duration_since(mtime.into_std())
                .unwrap_or(Duration::ZERO);
            let name = entry.file_name();
            let partial = name.to_string_lossy().starts_with(PARTIAL_PREFIX);
            let expired = if partial {
                age > STALE_PARTIAL
            } else {
                age > max_age
            };
            if !expired {
                continue;
            }
            match entry.remove_file() {
                Ok(()) if partial => report.partials_removed += 1,
                Ok(()) => {
                    report.removed += 1;
                    tracing::debug!(inbox = %path, file = ?name, "removed by retention");
                }
                Err(e) => {
                    tracing::warn!(inbox = %path, file = ?name, error = %e, "retention could not remove a file");
                }
            }
        }
    });
    if report.removed + report.partials_removed > 0 {
        tracing::debug!(
            removed = report.removed,
            partials = report.partials_removed,
            "inbox retention sweep"
        );
    }
    report
}

#[cfg(test)]
mod tests {
    use std::fs::FileTimes;

    use super::*;

    fn age(path: &std::path::Path, by: Duration) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        let t = SystemTime::now() - by;
        f.set_times(FileTimes::new().set_modified(t).set_accessed(t))
            .unwrap();
    }

    #[tokio::test]
    async fn sweeps_only_old_inbox_files() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let inbox = Workspace::inbox_dir("@a:b", "!r:b").to_path_under(tmp.path());
        let outbox = Workspace::outbox_dir("@a:b", "!r:b").to_path_under(tmp.path());
        std::fs::create_dir_all(&inbox).unwrap();
        std::fs::create_dir_all(&outbox).unwrap();
        let old = inbox.join("old.txt");
        let fresh = inbox.join("fresh.txt");
        let old_partial = inbox.join(".partial-old");
        let new_partial = inbox.join(".partial-new");
        let old_outbox = outbox.join("old.txt");
        for p in [&old, &fresh, &old_partial, &new_partial, &old_outbox] {
            std::fs::write(p, b"x").unwrap();
        }
        age(&old, Duration::from_secs(31 * 24 * 3600));
        age(&old_partial, Duration::from_secs(2 * 24 * 3600));
        age(&new_partial, Duration::from_secs(3600));
        age(&old_outbox, Duration::from_secs(31 * 24 * 3600));
        // A symlink to an old file elsewhere: neither it nor its target is touched.
        let target = tmp.path().join("target.txt");
        std::fs::write(&target, b"keep").unwrap();
        age(&target, Duration::from_secs(31 * 24 * 3600));
        std::os::unix::fs::symlink(&target, inbox.join("link")).unwrap();

        let report = sweep_inboxes(&ws, Duration::from_secs(30 * 24 * 3600)).await;
        assert_eq!(
            report,
            SweepReport {
                removed: 1,
                partials_removed: 1
            }
        );
        assert!(!old.exists() && !old_partial.exists());
        assert!(fresh.exists() && new_partial.exists() && old_outbox.exists());
        assert!(target.exists() && inbox.join("link").symlink_metadata().is_ok());
    }
}
