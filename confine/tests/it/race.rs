//! Swaps what a reachable path is, as fast as it can, while other threads keep opening it:
//! the file itself cycles through a regular file, a symlink to a file outside the workspace and
//! a *hard link* to that outside file; a folder on the way flips (atomically,
//! `RENAME_EXCHANGE`) between a real folder and a symlink to a folder outside. Whatever the
//! interleaving, the opener never hands out the outside file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cap_std::fs::Dir;
use confine::{ChatScope, ConfineError, open_reachable};
use protocol::{ChatId, WorkspacePath};
use rustix::fs::{CWD, RenameFlags, renameat_with};

const CANARY: &[u8] = b"CANARY-outside-the-workspace";
const ROOM: &str = "!room:example.org";
/// How long the openers race the swapper.
const RACE: Duration = Duration::from_secs(3);
const OPENERS: usize = 3;

#[derive(Default)]
struct Counts {
    attempts: AtomicU64,
    opened: AtomicU64,
    refused: AtomicU64,
    canary_reads: AtomicU64,
    hard_link_refusals: AtomicU64,
}

/// Plants, over and over: the inside file, a symlink to the canary, a hard link to the canary
/// (each renamed over the reachable name), and exchanges the inside folder with a link to the
/// outside one. Every 256 swaps it rests a little, so opens also find the path still.
fn swap(stop: &AtomicBool, file: &Path, sub: &Path, sub_link: &Path, canary: &Path) -> u64 {
    let dir = file.parent().unwrap().to_owned();
    let tmp = dir.join(".swap");
    let mut swaps = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let _ = std::fs::remove_file(&tmp);
        match swaps % 3 {
            0 => std::fs::write(&tmp, b"inside").unwrap(),
            1 => std::os::unix::fs::symlink(canary, &tmp).unwrap(),
            _ => std::fs::hard_link(canary, &tmp).unwrap(),
        }
        std::fs::rename(&tmp, file).unwrap();
        renameat_with(CWD, sub, CWD, sub_link, RenameFlags::EXCHANGE).unwrap();
        swaps += 1;
        if swaps.is_multiple_of(256) {
            // Rest on the inside file and the real folder.
            std::fs::write(&tmp, b"inside").unwrap();
            std::fs::rename(&tmp, file).unwrap();
            if std::fs::symlink_metadata(sub)
                .unwrap()
                .file_type()
                .is_symlink()
            {
                renameat_with(CWD, sub, CWD, sub_link, RenameFlags::EXCHANGE).unwrap();
            }
            std::thread::sleep(Duration::from_millis(80));
        }
    }
    swaps
}

fn open_loop(root: &Dir, scope: &ChatScope, paths: &[WorkspacePath], until: Instant, n: &Counts) {
    let mut i = 0usize;
    while Instant::now() < until {
        let path = &paths[i % paths.len()];
        i += 1;
        n.attempts.fetch_add(1, Ordering::Relaxed);
        match open_reachable(root, scope, path, 1 << 20) {
            Ok(mut c) => {
                n.opened.fetch_add(1, Ordering::Relaxed);
                let mut content = Vec::new();
                std::io::Read::read_to_end(&mut c.file, &mut content).unwrap();
                if content == CANARY {
                    n.canary_reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                if matches!(e, ConfineError::HardLinked(_) | ConfineError::Changing(_)) {
                    n.hard_link_refusals.fetch_add(1, Ordering::Relaxed);
                }
                n.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn swapping_links_in_a_race_never_reaches_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let canary = outside.join("f.txt");
    std::fs::write(&canary, CANARY).unwrap();

    let scope = ChatScope::new(ChatId::for_conversation(ROOM, None), ROOM);
    let own = scope.own_dir().to_string();
    let chat_dir = root.join(&own);
    let sub = chat_dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("f.txt"), b"inside").unwrap();
    let file = chat_dir.join("race.txt");
    std::fs::write(&file, b"inside").unwrap();
    let sub_link = chat_dir.join("sub-link");
    std::os::unix::fs::symlink(&outside, &sub_link).unwrap();
    let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority()).unwrap();
    let paths = [
        WorkspacePath::new(format!("{own}/race.txt")).unwrap(),
        WorkspacePath::new(format!("{own}/sub/f.txt")).unwrap(),
    ];

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, file, sub, sub_link, canary) = (
            stop.clone(),
            file.clone(),
            sub.clone(),
            sub_link.clone(),
            canary.clone(),
        );
        std::thread::spawn(move || swap(&stop, &file, &sub, &sub_link, &canary))
    };
    let counts = Counts::default();
    let until = Instant::now() + RACE;
    std::thread::scope(|s| {
        for _ in 0..OPENERS {
            s.spawn(|| open_loop(&dir, &scope, &paths, until, &counts));
        }
    });
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "race: attempts={} swaps={swaps} opened={} refused={} hard_link_or_changing={} canary_reads={}",
        get(&counts.attempts),
        get(&counts.opened),
        get(&counts.refused),
        get(&counts.hard_link_refusals),
        get(&counts.canary_reads),
    );
    assert_eq!(get(&counts.canary_reads), 0, "the outside file was read");
    assert!(
        get(&counts.opened) > 0 && get(&counts.refused) > 0,
        "both states were seen"
    );
    assert!(get(&counts.hard_link_refusals) > 0, "the hard link was met");
}
