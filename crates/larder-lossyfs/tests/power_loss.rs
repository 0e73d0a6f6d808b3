//! The layer drops exactly what was not synced: file data not fsynced, and names created,
//! renamed or unlinked in a directory not fsynced since. Needs root and /dev/fuse (the nemesis
//! suite's power losses need them too); elsewhere it says so and passes without checking.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Mount {
    child: Child,
    point: PathBuf,
}

impl Mount {
    fn start(backing: &Path, point: &Path) -> Mount {
        let child = Command::new(env!("CARGO_BIN_EXE_larder-lossyfs"))
            .arg(backing)
            .arg(point)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let point_text = point.display().to_string();
        loop {
            let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
            if mounts
                .lines()
                .any(|l| l.split(' ').nth(1) == Some(point_text.as_str()))
            {
                break;
            }
            assert!(Instant::now() < deadline, "lossyfs did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        Mount {
            child,
            point: point.to_owned(),
        }
    }

    /// SIGKILL the file system (what it held in memory is gone) and detach the mount.
    fn power_loss(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let status = Command::new("umount")
            .arg("-l")
            .arg(&self.point)
            .status()
            .unwrap();
        assert!(status.success());
        std::mem::forget(self);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.point).status();
    }
}

fn sync_dir(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

fn write(path: &Path, data: &[u8], sync: bool) {
    let mut file = File::create(path).unwrap();
    file.write_all(data).unwrap();
    if sync {
        file.sync_data().unwrap();
    }
}

fn usable() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("lossyfs power_loss test skipped: needs root and /dev/fuse");
    }
    root && fuse
}

/// A fresh layer mounted in a temporary directory: the directory, the backing directory, the
/// mount point and the mount.
fn mounted() -> (tempfile::TempDir, PathBuf, PathBuf, Mount) {
    let dir = tempfile::tempdir().unwrap();
    let (backing, point) = (dir.path().join("backing"), dir.path().join("mnt"));
    fs::create_dir_all(&point).unwrap();
    let mount = Mount::start(&backing, &point);
    (dir, backing, point, mount)
}

#[test]
fn a_power_loss_keeps_what_was_synced_and_drops_the_rest() {
    if !usable() {
        return;
    }
    let (_dir, backing, point, mount) = mounted();
    let d = point.join("d");
    fs::create_dir(&d).unwrap();
    write(&d.join("synced"), b"kept", true);
    write(&d.join("renamed-before"), b"moved", true);
    write(&d.join("unlinked"), b"gone", true);
    sync_dir(&d);
    sync_dir(&point);
    // After the last directory sync: data appended without fsync, a file whose data was synced
    // but whose name was not, a rename and an unlink not followed by a directory sync.
    OpenOptions::new()
        .append(true)
        .open(d.join("synced"))
        .unwrap()
        .write_all(b" and lost")
        .unwrap();
    write(&d.join("name-not-synced"), b"data synced", true);
    fs::rename(d.join("renamed-before"), d.join("renamed-after")).unwrap();
    fs::remove_file(d.join("unlinked")).unwrap();
    fs::create_dir(point.join("dir-not-synced")).unwrap();
    assert_eq!(fs::read(d.join("synced")).unwrap(), b"kept and lost");
    mount.power_loss();

    let _mount = Mount::start(&backing, &point);
    let mut names: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["renamed-before", "synced", "unlinked"]);
    assert_eq!(fs::read(d.join("synced")).unwrap(), b"kept");
    assert_eq!(fs::read(d.join("renamed-before")).unwrap(), b"moved");
    assert!(!point.join("dir-not-synced").exists());
    // Synced again, the same changes survive the next power loss.
    fs::rename(d.join("renamed-before"), d.join("renamed-after")).unwrap();
    sync_dir(&d);
    assert_eq!(fs::read(d.join("renamed-after")).unwrap(), b"moved");
}

/// Larder's store on this layer: once `Disk::rotate_journal` returned, the old journal file is
/// gone for good. A replica rebuilt in place after a rotation relies on it: a power loss that
/// brought the old file back would have its frames replayed over the new replica's segments.
#[test]
fn a_store_journal_rotation_is_not_undone_by_a_power_loss() {
    use larder_store::{BlobMeta, Disk, DiskOptions, Options, Store};
    if !usable() {
        return;
    }
    let (_dir, backing, point, mount) = mounted();
    let root = point.join("disk");
    fs::create_dir(&root).unwrap();
    sync_dir(&point);
    let journals = |root: &Path| {
        let mut names: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".jnl"))
            .collect();
        names.sort();
        names
    };
    let disk = Disk::open(&root, DiskOptions::default()).unwrap();
    let store = Store::open_on(&disk, root.join("p0"), Options::default()).unwrap();
    let meta = BlobMeta {
        props: bytes::Bytes::from_static(b"p"),
        time_ms: 1,
        expires_ms: None,
    };
    let value = bytes::Bytes::from_static(b"value");
    store.put_blob(b"k", meta, &[value]).unwrap();
    let before = journals(&root);
    disk.rotate_journal().unwrap();
    let rotated = journals(&root);
    assert_eq!(rotated.len(), 1, "{rotated:?}");
    assert_ne!(rotated, before);
    // The power goes out with the disk open: its threads are left to the dead mount.
    std::mem::forget(store);
    std::mem::forget(disk);
    mount.power_loss();

    let _mount = Mount::start(&backing, &point);
    assert_eq!(
        journals(&root),
        rotated,
        "the rotated-out journal file came back"
    );
}
