//! Index checkpoints (`index.ckpt`): a snapshot of the index and the log position it covers, so
//! opening replays only the log after it. Written to a temp file, synced, renamed over the old
//! one and the directory synced, so a crash leaves either the old or the new checkpoint.
//! A checkpoint that fails its CRC or disagrees with the segments is ignored (full replay).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::engine::Engine;
use crate::format::{head_len, FILE_HEADER_LEN, FORMAT_VERSION};
use crate::index::{BlobState, DocState, Index, LiveBlob, Tomb};
use crate::segment::{sync_dir, Segment};
use crate::types::{BlobMeta, Error, Location, LogPos, Result};

pub(crate) const CHECKPOINT_FILE: &str = "index.ckpt";
pub(crate) const TMP_PREFIX: &str = "index.ckpt.tmp";
const MAGIC: &[u8; 8] = b"LRDRCKPT";
const HEADER_LEN: usize = 48;
const BLOB_LIVE: u8 = 1;
// Tags 2, 3 and 4 (tombstones and live documents without the fields the tombstone drop rule
// needs) were written before tombstones could be dropped: such a checkpoint is ignored and the
// log replayed, which rebuilds those fields exactly.
const BLOB_DELETED: u8 = 5;
const DOC_LIVE: u8 = 6;
const DOC_REMOVED: u8 = 7;

#[derive(Default)]
pub(crate) struct CheckpointState {
    /// Serialises checkpoint writers (background and `close`) and compaction's swaps.
    pub lock: Mutex<()>,
    running: AtomicBool,
    since: AtomicU64,
    tmp_seq: AtomicU64,
}

impl CheckpointState {
    pub fn with_since(records: u64) -> Self {
        CheckpointState {
            since: AtomicU64::new(records),
            ..Default::default()
        }
    }
}

impl Engine {
    /// Counts published records and starts a background checkpoint when enough accumulated, so
    /// writers never wait for one.
    pub(crate) fn note_published(&self, records: u64) {
        let every = self.opts.checkpoint_every_records;
        let since = self.ckpt.since.fetch_add(records, Ordering::Relaxed) + records;
        if every == 0 || since < every || self.ckpt.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("larder-checkpoint".into())
            .spawn(move || {
                if let Some(engine) = me.upgrade() {
                    if let Err(e) = engine.write_checkpoint() {
                        tracing::warn!(error = %e, "background index checkpoint failed");
                    }
                    engine.ckpt.running.store(false, Ordering::Release);
                }
            });
        if spawned.is_err() {
            self.ckpt.running.store(false, Ordering::Release);
        }
    }

    pub(crate) fn write_checkpoint(&self) -> Result<()> {
        let _one_at_a_time = self.ckpt.lock.lock();
        self.write_checkpoint_locked()
    }

    /// Removes the checkpoint (the caller holds `ckpt.lock`): before compaction changes the
    /// layout of a segment the checkpoint's locations point into.
    pub(crate) fn remove_checkpoint_locked(&self) -> Result<()> {
        match std::fs::remove_file(self.dir.join(CHECKPOINT_FILE)) {
            Ok(()) => sync_dir(&self.dir).map_err(crate::segment::io_error),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// [`Engine::write_checkpoint`] for a caller that holds `ckpt.lock`.
    pub(crate) fn write_checkpoint_locked(&self) -> Result<()> {
        let bytes = {
            let index = self.index.read();
            self.ckpt.since.store(0, Ordering::Relaxed);
            encode(&index)
        };
        let seq = self.ckpt.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}-{}-{seq}", std::process::id()));
        let result = write_synced(&tmp, &bytes)
            .and_then(|()| std::fs::rename(&tmp, self.dir.join(CHECKPOINT_FILE)))
            .and_then(|()| sync_dir(&self.dir));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(crate::segment::io_error)
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn put_key(out: &mut Vec<u8>, tag: u8, key: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
}

/// The fields of a tombstone after its time: sequence and shadowed puts.
fn put_tomb(out: &mut Vec<u8>, tomb: &Tomb) {
    out.extend_from_slice(&tomb.seq.to_le_bytes());
    out.extend_from_slice(&tomb.shadows.to_le_bytes());
}

fn put_loc(out: &mut Vec<u8>, size: u64, loc: &Location) {
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&loc.segment.to_le_bytes());
    out.extend_from_slice(&loc.offset.to_le_bytes());
}

pub(crate) fn encode(index: &Index) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64 * (index.blobs.len() + index.docs.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[FORMAT_VERSION, 0, 0, 0]);
    out.extend_from_slice(&index.durable.segment.to_le_bytes());
    out.extend_from_slice(&index.durable.offset.to_le_bytes());
    out.extend_from_slice(&(index.blobs.len() as u64).to_le_bytes());
    out.extend_from_slice(&(index.docs.len() as u64).to_le_bytes());
    out.extend_from_slice(&index.last_seq.to_le_bytes());
    for (key, blob) in &index.blobs {
        match blob {
            BlobState::Deleted(tomb) => {
                put_key(&mut out, BLOB_DELETED, key);
                out.extend_from_slice(&tomb.time_ms.to_le_bytes());
                put_tomb(&mut out, tomb);
            }
            BlobState::Live(b) => {
                put_key(&mut out, BLOB_LIVE, key);
                out.extend_from_slice(&b.meta.time_ms.to_le_bytes());
                out.push(b.meta.expires_ms.is_some() as u8);
                out.extend_from_slice(&b.meta.expires_ms.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&(b.meta.props.len() as u32).to_le_bytes());
                out.extend_from_slice(&b.meta.props);
                put_loc(&mut out, b.size, &b.loc);
            }
        }
    }
    for (key, doc) in &index.docs {
        let tag = if matches!(doc, DocState::Live { .. }) {
            DOC_LIVE
        } else {
            DOC_REMOVED
        };
        put_key(&mut out, tag, key);
        match doc {
            DocState::Removed { version, tomb } => {
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&tomb.time_ms.to_le_bytes());
                put_tomb(&mut out, tomb);
            }
            DocState::Live {
                version,
                time_ms,
                size,
                loc,
                shadows,
            } => {
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&time_ms.to_le_bytes());
                out.extend_from_slice(&shadows.to_le_bytes());
                put_loc(&mut out, *size, loc);
            }
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Loads the checkpoint in `dir`. `Ok(None)` when there is none or it cannot be trusted (the
/// caller then replays the whole log); an error only for a newer format or an unreadable file.
pub(crate) fn load(dir: &Path, segments: &[(Segment, u64)]) -> Result<Option<Index>> {
    let bytes = match std::fs::read(dir.join(CHECKPOINT_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let segs: HashMap<u32, &(Segment, u64)> = segments.iter().map(|s| (s.0.id, s)).collect();
    match decode(&bytes, &segs) {
        Ok(index) => Ok(Some(index)),
        Err(Bad::Version(found)) => Err(Error::UnsupportedVersion {
            found,
            supported: FORMAT_VERSION,
            location: dir.join(CHECKPOINT_FILE).display().to_string(),
        }),
        Err(Bad::Corrupt(why)) => {
            tracing::warn!(dir = %dir.display(), why, "ignoring index checkpoint; replaying the whole log");
            Ok(None)
        }
    }
}

#[derive(Debug)]
enum Bad {
    Version(u8),
    Corrupt(&'static str),
}

/// Bounds-checked little-endian reader: a truncated checkpoint yields an error, never a panic.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.0.len() < n {
            return Err(Bad::Corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Bad> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

type Segs<'a> = HashMap<u32, &'a (Segment, u64)>;

fn decode(bytes: &[u8], segs: &Segs) -> Result<Index, Bad> {
    if bytes.len() < HEADER_LEN + 4 || &bytes[..8] != MAGIC {
        return Err(Bad::Corrupt("bad magic or too short"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    // CRC before version: a flipped version bit is corruption, not a newer format.
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(Bad::Corrupt("checksum mismatch"));
    }
    if body[8] != FORMAT_VERSION {
        return Err(Bad::Version(body[8]));
    }
    let mut rd = Rd(&body[12..]);
    let durable = LogPos {
        segment: rd.u32()?,
        offset: rd.u64()?,
    };
    match segs.get(&durable.segment) {
        Some((_, len)) if durable.offset >= FILE_HEADER_LEN && durable.offset <= *len => {}
        _ => return Err(Bad::Corrupt("cursor beyond the log")),
    }
    let (nblobs, ndocs, last_seq) = (rd.u64()?, rd.u64()?, rd.u64()?);
    let mut index = Index {
        durable,
        last_seq,
        ..Index::default()
    };
    // Capacity hints are bounded by the input so a forged count cannot exhaust memory.
    index
        .blobs
        .reserve(nblobs.min(body.len() as u64 / 11) as usize);
    for _ in 0..nblobs {
        decode_blob(&mut rd, segs, &mut index)?;
    }
    index
        .docs
        .reserve(ndocs.min(body.len() as u64 / 19) as usize);
    for _ in 0..ndocs {
        decode_doc(&mut rd, segs, &mut index)?;
    }
    if !rd.0.is_empty() {
        return Err(Bad::Corrupt("trailing bytes"));
    }
    Ok(index)
}

fn key(rd: &mut Rd) -> Result<(u8, Bytes), Bad> {
    let tag = rd.u8()?;
    let len = rd.u16()? as usize;
    if len == 0 || len > crate::types::MAX_KEY_LEN {
        return Err(Bad::Corrupt("bad key length"));
    }
    Ok((tag, Bytes::copy_from_slice(rd.take(len)?)))
}

/// Reads a location and checks the record it names fits inside its segment.
fn location(
    rd: &mut Rd,
    segs: &Segs,
    key_len: usize,
    props_len: usize,
) -> Result<(u64, Location), Bad> {
    let (size, segment, offset) = (rd.u64()?, rd.u32()?, rd.u64()?);
    let (seg, len) = segs.get(&segment).ok_or(Bad::Corrupt("unknown segment"))?;
    let end = offset
        .checked_add(head_len(key_len, props_len, size))
        .and_then(|e| e.checked_add(size));
    if offset < FILE_HEADER_LEN || end.is_none_or(|e| e > *len) {
        return Err(Bad::Corrupt("location beyond its segment"));
    }
    Ok((
        size,
        Location {
            segment,
            offset,
            file: seg.file.clone(),
        },
    ))
}

fn decode_blob(rd: &mut Rd, segs: &Segs, index: &mut Index) -> Result<(), Bad> {
    let (tag, key) = key(rd)?;
    let time_ms = rd.u64()?;
    let state = match tag {
        BLOB_DELETED => BlobState::Deleted(Tomb {
            time_ms,
            seq: rd.u64()?,
            shadows: rd.u32()?,
        }),
        BLOB_LIVE => {
            let has_expiry = rd.u8()?;
            let expires = rd.u64()?;
            let props_len = rd.u32()? as usize;
            let props = Bytes::copy_from_slice(rd.take(props_len)?);
            let (size, loc) = location(rd, segs, key.len(), props_len)?;
            let expires_ms = match has_expiry {
                0 => None,
                1 => Some(expires),
                _ => return Err(Bad::Corrupt("bad expiry flag")),
            };
            index.live_keys += 1;
            BlobState::Live(LiveBlob {
                meta: BlobMeta {
                    props,
                    time_ms,
                    expires_ms,
                },
                size,
                loc,
            })
        }
        _ => return Err(Bad::Corrupt("bad blob tag")),
    };
    index.blobs.insert(key, state);
    Ok(())
}

fn decode_doc(rd: &mut Rd, segs: &Segs, index: &mut Index) -> Result<(), Bad> {
    let (tag, key) = key(rd)?;
    let (version, time_ms) = (rd.u64()?, rd.u64()?);
    let state = match tag {
        DOC_REMOVED => DocState::Removed {
            version,
            tomb: Tomb {
                time_ms,
                seq: rd.u64()?,
                shadows: rd.u32()?,
            },
        },
        DOC_LIVE => {
            let shadows = rd.u32()?;
            let (size, loc) = location(rd, segs, key.len(), 0)?;
            index.live_keys += 1;
            DocState::Live {
                version,
                time_ms,
                size,
                loc,
                shadows,
            }
        }
        _ => return Err(Bad::Corrupt("bad doc tag")),
    };
    index.docs.insert(key, state);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    /// One segment 1 MiB long, so a checkpoint's position can name it.
    fn segments() -> (tempfile::NamedTempFile, Vec<(Segment, u64)>) {
        let file = tempfile::NamedTempFile::new().unwrap();
        let seg = Segment {
            id: 1,
            file: Arc::new(file.reopen().unwrap()),
            first_seq: 1,
            gen: 0,
        };
        (file, vec![(seg, 1 << 20)])
    }

    fn tomb() -> impl Strategy<Value = Tomb> {
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(time_ms, seq, shadows)| Tomb {
            time_ms,
            seq,
            shadows,
        })
    }

    proptest! {
        /// Tombstones (blob and document) keep their sequence and shadow count through a
        /// checkpoint.
        #[test]
        fn tombstones_round_trip(
            blobs in proptest::collection::vec((1u8..255, tomb()), 0..20),
            docs in proptest::collection::vec((1u8..255, any::<u64>(), tomb()), 0..20),
        ) {
            let (_file, segs) = segments();
            let mut index = Index {
                durable: LogPos { segment: 1, offset: FILE_HEADER_LEN },
                ..Index::default()
            };
            for (k, t) in &blobs {
                index.blobs.insert(Bytes::from(vec![*k]), BlobState::Deleted(*t));
            }
            for (k, version, t) in &docs {
                index.docs.insert(Bytes::from(vec![*k]), DocState::Removed { version: *version, tomb: *t });
            }
            let map: Segs = segs.iter().map(|s| (s.0.id, s)).collect();
            let back = decode(&encode(&index), &map).unwrap();
            prop_assert_eq!(back.blobs.len(), index.blobs.len());
            for (k, b) in &index.blobs {
                let (BlobState::Deleted(want), Some(BlobState::Deleted(got))) = (b, back.blobs.get(k)) else {
                    panic!("blob {k:?} lost");
                };
                prop_assert_eq!(want, got);
            }
            for (k, d) in &index.docs {
                let (DocState::Removed { version: v1, tomb: t1 }, Some(DocState::Removed { version: v2, tomb: t2 })) = (d, back.docs.get(k)) else {
                    panic!("doc {k:?} lost");
                };
                prop_assert_eq!((v1, t1), (v2, t2));
            }
        }

        /// Any body with a valid checksum decodes to an index or an error, never a panic, and
        /// the old tags (2, 3, 4) are refused (a full replay rebuilds what they lack).
        #[test]
        fn any_checksummed_body_decodes_or_is_refused(
            counts in (0u64..4, 0u64..4),
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let (_file, segs) = segments();
            let map: Segs = segs.iter().map(|s| (s.0.id, s)).collect();
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&[FORMAT_VERSION, 0, 0, 0]);
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&FILE_HEADER_LEN.to_le_bytes());
            bytes.extend_from_slice(&counts.0.to_le_bytes());
            bytes.extend_from_slice(&counts.1.to_le_bytes());
            bytes.extend_from_slice(&7u64.to_le_bytes());
            let old_tag = body.first().is_some_and(|t| (2..=4).contains(t));
            bytes.extend_from_slice(&body);
            let crc = crc32c::crc32c(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            let decoded = decode(&bytes, &map);
            if old_tag && counts.0 + counts.1 > 0 {
                prop_assert!(decoded.is_err());
            }
        }
    }
}
