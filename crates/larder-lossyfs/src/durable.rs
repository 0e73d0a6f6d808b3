//! What survives a power loss: the durable image in the backing directory. `manifest.json` holds
//! the durable namespace (each directory's entries as of its last fsync, and the inode numbers),
//! `data/<ino>` each file's contents as of its last fsync. Nothing else is ever written there, so
//! killing the file system's process loses exactly what was not synced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const ROOT: u64 = 1;

#[derive(Serialize, Deserialize)]
pub struct Manifest {
    pub next_ino: u64,
    /// Directory inode → its entries (name → inode) at its last fsync.
    pub dirs: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Permission bits of every durable inode.
    pub modes: BTreeMap<u64, u32>,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            next_ino: ROOT + 1,
            dirs: BTreeMap::from([(ROOT, BTreeMap::new())]),
            modes: BTreeMap::from([(ROOT, 0o755)]),
        }
    }
}

pub struct Backing {
    dir: PathBuf,
}

impl Backing {
    pub fn open(dir: &Path) -> std::io::Result<Backing> {
        std::fs::create_dir_all(dir.join("data"))?;
        Ok(Backing {
            dir: dir.to_owned(),
        })
    }

    pub fn load_manifest(&self) -> std::io::Result<Manifest> {
        match std::fs::read(self.dir.join("manifest.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaced whole by a rename: the host does not lose power, only this process dies.
    pub fn save_manifest(&self, manifest: &Manifest) -> std::io::Result<()> {
        let tmp = self.dir.join("manifest.json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(manifest).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, self.dir.join("manifest.json"))
    }

    pub fn read_data(&self, ino: u64) -> std::io::Result<Vec<u8>> {
        match std::fs::read(self.data_path(ino)) {
            Ok(bytes) => Ok(bytes),
            // Named durably but never synced: empty, as after a crash.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    pub fn write_data(&self, ino: u64, data: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join("data").join(format!("{ino}.tmp"));
        std::fs::write(&tmp, data)?;
        std::fs::rename(tmp, self.data_path(ino))
    }

    /// Removes the data of inodes the durable namespace no longer reaches (at mount).
    pub fn collect_garbage(&self, live: &dyn Fn(u64) -> bool) -> std::io::Result<()> {
        for entry in std::fs::read_dir(self.dir.join("data"))? {
            let entry = entry?;
            let name = entry.file_name();
            let ino = name.to_str().and_then(|n| n.parse::<u64>().ok());
            if !ino.is_some_and(live) {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    fn data_path(&self, ino: u64) -> PathBuf {
        self.dir.join("data").join(ino.to_string())
    }
}
