//! Changing a running cluster's map: which offered map replaces the current one, and writing the
//! accepted one durably. A map is taken whole or not at all: validated first (`from_toml`), then
//! compared by revision here.

use std::io::Write;
use std::path::Path;

use crate::map::{ClusterMap, MapError};

/// What to do with an offered map that validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// A newer revision: take it.
    Newer,
    /// The revision and content this holder already runs: nothing to do.
    Same,
}

impl ClusterMap {
    /// Whether `offered` (already validated) replaces `self`: only a greater revision does; the
    /// same revision with the same content is a no-op; anything else is refused, and the
    /// current map stays.
    pub fn compare_offer(&self, offered: &ClusterMap) -> Result<Offer, MapError> {
        if offered.revision > self.revision {
            return Ok(Offer::Newer);
        }
        if offered.revision < self.revision {
            return Err(MapError::Older {
                offered: offered.revision,
                current: self.revision,
            });
        }
        if offered == self {
            Ok(Offer::Same)
        } else {
            Err(MapError::Conflict(offered.revision))
        }
    }

    /// Compare-and-set for the map authority: `offered` must be exactly the next revision of
    /// `self` (or `self` again, a no-op), so two changes computed from one map cannot both land.
    pub fn compare_next(&self, offered: &ClusterMap) -> Result<Offer, MapError> {
        match self.compare_offer(offered)? {
            Offer::Newer if Some(offered.revision) != self.revision.checked_add(1) => {
                Err(MapError::NotNext {
                    offered: offered.revision,
                    current: self.revision,
                })
            }
            offer => Ok(offer),
        }
    }

    /// The node that decides map changes (the map authority): the first node listed that holds
    /// a replica that is not leaving. Draining or replacing it hands the role to the next node
    /// in the revision that starts the plan, so a dead authority can be replaced.
    pub fn authority(&self) -> Option<&str> {
        self.nodes.iter().map(|n| n.id.as_str()).find(|node| {
            self.partitions.iter().any(|p| {
                p.replicas
                    .iter()
                    .any(|r| r.node == *node && r.state != crate::ReplicaState::Leaving)
            })
        })
    }

    /// The map with its revision one higher (a change's next map starts here).
    pub fn next_revision(&self) -> Result<ClusterMap, MapError> {
        let mut next = self.clone();
        next.revision = self
            .revision
            .checked_add(1)
            .ok_or_else(|| MapError::Invalid("the map revision is at its maximum".into()))?;
        Ok(next)
    }

    /// Writes the map so that a crash leaves the old file or the new one, never a torn one, and
    /// the new one survives power loss once this returns: temporary file, fsync, rename, fsync of
    /// the directory.
    pub fn save_durably(&self, path: &Path) -> Result<(), MapError> {
        let error = |source| MapError::Write {
            path: path.display().to_string(),
            source,
        };
        let tmp = path.with_extension("toml.tmp");
        let mut file = std::fs::File::create(&tmp).map_err(error)?;
        file.write_all(self.to_toml().as_bytes()).map_err(error)?;
        file.sync_all().map_err(error)?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(error)?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(error)
    }
}

/// Largest map file read (a map of thousands of partitions is a few hundred KiB).
pub const MAX_MAP_BYTES: u64 = 16 << 20;

/// Watches a map file by its modification time and length: `changed` reads and parses it only
/// when either moved since the last call.
#[derive(Debug, Default)]
pub struct FileWatch {
    seen: Option<(std::time::SystemTime, u64)>,
}

impl FileWatch {
    /// A watch that treats the file as read now (its current stamp).
    pub fn seen_now(path: &Path) -> FileWatch {
        FileWatch {
            seen: stamp(path).ok(),
        }
    }

    /// `None` while the file is unchanged; otherwise the map it now holds, or why it cannot be
    /// used. A file too large is refused unread.
    pub fn changed(&mut self, path: &Path) -> Option<Result<ClusterMap, MapError>> {
        let read_error = |source| MapError::Read {
            path: path.display().to_string(),
            source,
        };
        let now = match stamp(path) {
            Ok(now) => now,
            Err(err) => return Some(Err(read_error(err))),
        };
        if self.seen == Some(now) {
            return None;
        }
        self.seen = Some(now);
        if now.1 > MAX_MAP_BYTES {
            return Some(Err(MapError::Invalid(format!(
                "{} is {} bytes, more than a map may be ({MAX_MAP_BYTES})",
                path.display(),
                now.1
            ))));
        }
        Some(ClusterMap::load(path))
    }
}

fn stamp(path: &Path) -> std::io::Result<(std::time::SystemTime, u64)> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.modified()?, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{init_map, LayoutSpec};

    fn base() -> ClusterMap {
        init_map(&LayoutSpec {
            datacenters: vec!["dc1".into()],
            node_addresses: (0..3)
                .map(|i| format!("127.0.0.1:{}", 7100 + i).parse().unwrap())
                .collect(),
            partitions: 4,
            replicas_per_datacenter: 3,
        })
        .unwrap()
    }

    #[test]
    fn only_a_newer_revision_replaces_the_map() {
        let current = base();
        let mut next = current.next_revision().unwrap();
        assert_eq!(current.compare_offer(&next).unwrap(), Offer::Newer);
        assert_eq!(current.compare_offer(&current).unwrap(), Offer::Same);
        let err = next.compare_offer(&current).unwrap_err().to_string();
        assert!(
            err.contains("revision 1 is older than the current 2"),
            "{err}"
        );
        next.revision = 1;
        next.partitions[0].replicas.swap(0, 1);
        let err = current.compare_offer(&next).unwrap_err().to_string();
        assert!(err.contains("different content"), "{err}");
    }

    #[test]
    fn the_authority_takes_only_the_next_revision() {
        let current = base();
        let next = current.next_revision().unwrap();
        assert_eq!(current.compare_next(&next).unwrap(), Offer::Newer);
        let skip = next.next_revision().unwrap();
        let err = current.compare_next(&skip).unwrap_err().to_string();
        assert!(err.contains("not the next revision"), "{err}");
        let mut last = current.clone();
        last.revision = u64::MAX;
        assert!(last.next_revision().is_err());
    }

    #[test]
    fn durable_save_and_file_watch() {
        let dir = tempfile_dir();
        let path = dir.join("cluster.toml");
        let map = base();
        map.save_durably(&path).unwrap();
        let mut watch = FileWatch::default();
        assert_eq!(watch.changed(&path).unwrap().unwrap(), map);
        assert!(
            watch.changed(&path).is_none(),
            "unchanged file is not re-read"
        );
        std::fs::write(&path, "revision = ").unwrap();
        assert!(watch.changed(&path).unwrap().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "larder-cluster-revision-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
