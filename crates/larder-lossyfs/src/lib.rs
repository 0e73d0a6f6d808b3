//! `larder-lossyfs`: a test tool for Larder's nemesis suite (`crates/larder-torture`). A FUSE
//! file system whose writes and namespace changes (create, mkdir, rename, unlink) live only in
//! its process's memory until `fsync`/`fdatasync` of the file (for data) or of the parent
//! directory (for names); the synced state is kept in a backing directory. Killing the process
//! (and lazily unmounting) is a power loss: a new mount starts from what was synced. SIGUSR1
//! fills the disk (statfs shows no free space, growing a file fails with ENOSPC); the next
//! SIGUSR1 empties it again.

mod durable;
mod fs;

pub use durable::Backing;
pub use fs::{LossyFs, FULL};

/// Mounts at `mountpoint` the durable image in `backing`, and serves until unmounted or killed.
pub fn serve(backing: &std::path::Path, mountpoint: &std::path::Path) -> std::io::Result<()> {
    let fs = LossyFs::mount_state(Backing::open(backing)?)?;
    let options = [
        fuser::MountOption::FSName("lossyfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    fuser::mount2(fs, mountpoint, &options)
}
