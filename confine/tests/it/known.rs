//! A file opened by the inode its writer gave (`open_file_as`): that very file is handed out
//! even while it keeps changing, and a hard link to an outside file at the same name is never
//! handed out for it. (Which handles wait, and how long, is the table test
//! `only_the_inode_its_writer_named_skips_the_wait` beside the code: a plain open of a changing
//! file here would depend on how the threads are scheduled.)

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cap_std::fs::Dir;
use confine::{ConfineError, open_file, open_file_as};
use protocol::WorkspacePath;

#[test]
fn the_writers_own_file_opens_while_it_changes_and_nothing_else_does() {
    let root_dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = Dir::open_ambient_dir(root_dir.path(), cap_std::ambient_authority()).unwrap();
    let file = root_dir.path().join("note.ogg");
    std::fs::write(&file, b"the surface's download").unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();
    let path = WorkspacePath::new("note.ogg").unwrap();

    // Its change time moves all the time (permissions toggled in a loop).
    let stop = Arc::new(AtomicBool::new(false));
    let toucher = {
        let (stop, file) = (stop.clone(), file.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::PermissionsExt;
            let mut mode = 0o644;
            while !stop.load(Ordering::Relaxed) {
                mode ^= 0o020;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        })
    };
    let known = open_file_as(&root, &path, 1 << 20, Some(inode));
    stop.store(true, Ordering::Relaxed);
    toucher.join().unwrap();
    assert_eq!(
        known.unwrap().size,
        22,
        "the writer's own file opens while its change time keeps moving"
    );
    // Still: a plain open hands out the same file once it has settled.
    assert_eq!(open_file(&root, &path, 1 << 20).unwrap().size, 22);

    // A hard link to an outside file at the name: refused whatever inode is claimed.
    let canary = outside.path().join("secret");
    std::fs::write(&canary, b"CANARY").unwrap();
    std::fs::remove_file(&file).unwrap();
    std::fs::hard_link(&canary, &file).unwrap();
    let linked = open_file_as(&root, &path, 1 << 20, Some(inode));
    assert!(
        matches!(linked, Err(ConfineError::HardLinked(_))),
        "{linked:?}"
    );
}
