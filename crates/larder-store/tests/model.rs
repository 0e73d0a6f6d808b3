//! Model-based test: random operation sequences against the store and a BTreeMap model, with
//! crashes (drop without close) and clean reopens in between, and compaction that drops
//! tombstones (a horizon and a time as inputs): nothing deleted ever comes back. Small segments force rotation and
//! a small checkpoint interval makes background checkpoints part of the story.

use std::collections::BTreeMap;

use bytes::Bytes;
use larder_store::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Put {
        key: u8,
        len: usize,
        chunks: usize,
        expires: Option<u64>,
    },
    Delete {
        key: u8,
        time: u64,
    },
    Get {
        key: u8,
        now: u64,
    },
    Read {
        key: u8,
        start: u64,
        len: u64,
    },
    PutDoc {
        key: u8,
        version: u64,
        len: usize,
    },
    RemoveDoc {
        key: u8,
        version: u64,
    },
    GetDoc {
        key: u8,
    },
    Changes {
        from: usize,
        limit: usize,
    },
    /// The next page of a feed reader kept across steps (an export resumed after a restart).
    FeedPage {
        limit: usize,
    },
    Crash,
    CloseReopen,
    /// Compact everything (seal the active segment, any garbage) with expiry decided at `now`;
    /// tombstones up to `horizon` percent of the sequences handed out so far (none: no
    /// horizon, a peer's position unknown) and older than `RETENTION` may be dropped.
    Compact {
        now: u64,
        horizon: Option<u64>,
        /// Only segments at least half garbage (otherwise any garbage at all).
        partial: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let key = 0u8..12;
    let len = prop_oneof![0usize..300, 60_000usize..140_000];
    prop_oneof![
        6 => (key.clone(), len, 1usize..4, proptest::option::of(0u64..100))
            .prop_map(|(key, len, chunks, expires)| Step::Put { key, len, chunks, expires }),
        2 => (key.clone(), 0u64..100).prop_map(|(key, time)| Step::Delete { key, time }),
        3 => (key.clone(), 0u64..100).prop_map(|(key, now)| Step::Get { key, now }),
        4 => (key.clone(), 0u64..150_000, 0u64..150_000).prop_map(|(key, start, len)| Step::Read { key, start, len }),
        4 => (key.clone(), 0u64..8, 0usize..3000).prop_map(|(key, version, len)| Step::PutDoc { key, version, len }),
        2 => (key.clone(), 0u64..8).prop_map(|(key, version)| Step::RemoveDoc { key, version }),
        2 => key.clone().prop_map(|key| Step::GetDoc { key }),
        2 => (0usize..60, 0usize..8).prop_map(|(from, limit)| Step::Changes { from, limit }),
        2 => (0usize..8).prop_map(|limit| Step::FeedPage { limit }),
        1 => Just(Step::Crash),
        1 => Just(Step::CloseReopen),
        3 => (0u64..120, proptest::option::of(0u64..=100), proptest::bool::ANY)
            .prop_map(|(now, horizon, partial)| Step::Compact { now, horizon, partial }),
    ]
}

#[derive(Clone, Debug)]
enum MBlob {
    Live {
        data: Vec<u8>,
        time: u64,
        expires: Option<u64>,
    },
    Deleted {
        time: u64,
        seq: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum MDoc {
    Live {
        version: u64,
        time: u64,
        json: Vec<u8>,
    },
    Removed {
        version: u64,
        time: u64,
        seq: u64,
    },
}

/// How old a tombstone must be (by its operation time) before compaction may drop it.
const RETENTION: u64 = 10;

/// A record of the log: (op, key, size, version, sequence).
type Entry = (Op, Vec<u8>, u64, u64, u64);

#[derive(Default)]
struct Model {
    blobs: BTreeMap<u8, MBlob>,
    docs: BTreeMap<u8, MDoc>,
    /// Every record appended and not yet compacted away, in log order.
    log: Vec<Entry>,
    /// Sequence numbers handed out (one per appended record).
    seqs: u64,
    clock: u64,
}

impl Model {
    fn append(&mut self, op: Op, key: u8, size: u64, version: u64) -> u64 {
        self.seqs += 1;
        self.log
            .push((op, key_bytes(key), size, version, self.seqs));
        self.seqs
    }

    /// Whether the store's feed shows this record: only what the index still serves.
    fn in_feed(&self, (op, key, _, version, seq): &Entry) -> bool {
        let k: u8 = std::str::from_utf8(&key[4..]).unwrap().parse().unwrap();
        match op {
            Op::PutBlob => matches!(self.blobs.get(&k), Some(MBlob::Live { .. })),
            Op::DeleteBlob => {
                matches!(self.blobs.get(&k), Some(MBlob::Deleted { seq: s, .. }) if s == seq)
            }
            Op::PutDoc | Op::RemoveDoc => self.docs.get(&k).is_some_and(|d| match d {
                MDoc::Live { version: v, .. } | MDoc::Removed { version: v, .. } => v == version,
            }),
        }
    }

    fn feed(&self) -> Vec<Entry> {
        self.log
            .iter()
            .filter(|e| self.in_feed(e))
            .cloned()
            .collect()
    }
}

fn key_bytes(key: u8) -> Vec<u8> {
    format!("key/{key}").into_bytes()
}

fn content(key: u8, len: usize, salt: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(2654435761)
                .wrapping_add(key as u64 * 97 + salt) as u8
        })
        .collect()
}

fn chunked(data: &[u8], chunks: usize) -> Vec<Bytes> {
    let step = data.len().div_ceil(chunks).max(1);
    data.chunks(step).map(Bytes::copy_from_slice).collect()
}

fn opts() -> Options {
    Options {
        segment_size: 48 << 10,
        max_record_size: 1 << 20,
        read_chunk_size: 7000,
        checkpoint_every_records: 7,
        durability: Durability::Durable,
        min_free_space: 0,
        compaction_yields_to: None,
        // Low, so that the model's large records go through the window of recently synced
        // ones too (`uncache.rs`; dropping them is `tests::large_records_leave_...`'s).
        uncache_synced_from: Some(64 << 10),
        // Matching: a large record the page cache lost is read back past it (`cold.rs`).
        direct_cold_reads_from: Some(64 << 10),
    }
}

/// A document lookup without its JSON bytes, so a failure message stays readable.
fn summary(d: &DocLookup) -> (u8, u64, u64, usize, u32) {
    match d {
        DocLookup::NotFound => (0, 0, 0, 0, 0),
        DocLookup::Removed { version, time_ms } => (1, *version, *time_ms, 0, 0),
        DocLookup::Found {
            version,
            time_ms,
            json,
        } => (2, *version, *time_ms, json.len(), crc(json)),
    }
}

fn crc(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

struct Harness {
    dir: tempfile::TempDir,
    store: Option<Store>,
    /// A reader paging the feed across steps; made again from its cursor after a reopen.
    feed: Option<FeedReader>,
    /// Its cursor while the store is closed.
    feed_cursor: Cursor,
    model: Model,
}

impl Harness {
    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    fn run(&mut self, step: Step) {
        self.model.clock += 1;
        let time = self.model.clock;
        match step {
            Step::Put {
                key,
                len,
                chunks,
                expires,
            } => self.put(key, len, chunks, expires, time),
            Step::Delete { key, time } => self.delete(key, time),
            Step::Get { key, now } => self.check_get(key, now),
            Step::Read { key, start, len } => self.check_read(key, start, start + len),
            Step::PutDoc { key, version, len } => self.put_doc(key, version, len, time),
            Step::RemoveDoc { key, version } => self.remove_doc(key, version, time),
            Step::GetDoc { key } => self.check_doc(key),
            Step::Changes { from, limit } => self.check_changes(from, limit),
            Step::FeedPage { limit } => self.check_feed_page(limit),
            Step::Crash => {
                self.drop_feed_reader();
                drop(self.store.take());
                self.reopen();
            }
            Step::CloseReopen => {
                self.drop_feed_reader();
                self.store().close().unwrap();
                drop(self.store.take());
                self.reopen();
            }
            Step::Compact {
                now,
                horizon,
                partial,
            } => self.compact(now, horizon, partial),
        }
    }

    /// Every garbage record goes: expired blobs are gone (not found), superseded puts and
    /// removes leave the log; so do tombstones past the horizon and the retention (a full pass
    /// drops a key's older puts, oldest segment first, before it comes to the tombstone);
    /// live data and its order stay.
    fn compact(&mut self, now: u64, horizon: Option<u64>, partial: bool) {
        let horizon = horizon.map(|pct| self.model.seqs * pct / 100);
        let opts = CompactOptions {
            min_garbage_ratio: if partial { 0.5 } else { 0.0 },
            now_ms: now,
            seal_active: true,
            max_bytes_per_sec: 0,
            tombstone_horizon: horizon,
            tombstone_retention_ms: RETENTION,
        };
        let report = self.store().compact(&opts).unwrap();
        assert_eq!(report.corrupt_records_dropped, 0);
        let droppable =
            |time: u64, seq: u64| horizon.is_some_and(|h| seq <= h) && time + RETENTION <= now;
        // A full pass drops every expired blob and droppable tombstone. A partial one drops
        // those in the segments it rewrote, which the model does not know: it asks the store,
        // which may say "gone" only for those (and reopens later check nothing comes back).
        let store = self.store.as_ref().unwrap();
        let gone = |key: u8| -> bool {
            if !partial {
                return true;
            }
            let k = key_bytes(key);
            let blob = store.get_blob(&k, now).unwrap();
            matches!(blob, BlobLookup::NotFound)
        };
        let doc_gone =
            |key: u8| !partial || store.get_doc(&key_bytes(key)).unwrap() == DocLookup::NotFound;
        let m = &mut self.model;
        let mut dropped = 0;
        m.blobs.retain(|k, b| match b {
            MBlob::Live {
                expires: Some(exp), ..
            } => now < *exp || !gone(*k),
            MBlob::Deleted { time, seq } => {
                let keep = !droppable(*time, *seq) || !gone(*k);
                dropped += !keep as u64;
                keep
            }
            _ => true,
        });
        m.docs.retain(|k, d| match d {
            MDoc::Removed { time, seq, .. } => {
                let keep = !droppable(*time, *seq) || !doc_gone(*k);
                dropped += !keep as u64;
                keep
            }
            MDoc::Live { .. } => true,
        });
        assert_eq!(report.tombstones_dropped, dropped, "{report:?}");
        m.log = m.feed();
        let live = m
            .blobs
            .values()
            .filter(|b| matches!(b, MBlob::Live { .. }))
            .count()
            + m.docs
                .values()
                .filter(|d| matches!(d, MDoc::Live { .. }))
                .count();
        assert_eq!(self.store().stats().live_keys, live as u64);
    }

    fn reopen(&mut self) {
        self.store = Some(open_when_unlocked(self.dir.path()));
        self.feed = Some(self.store().feed(self.feed_cursor));
        let stats = self.store().stats();
        assert_eq!(stats.corrupt_records_found, 0);
        let live = self
            .model
            .blobs
            .values()
            .filter(|b| matches!(b, MBlob::Live { .. }))
            .count()
            + self
                .model
                .docs
                .values()
                .filter(|d| matches!(d, MDoc::Live { .. }))
                .count();
        assert_eq!(stats.live_keys, live as u64);
        for key in 0..12 {
            self.check_get(key, 50);
            self.check_doc(key);
        }
        self.check_changes(0, usize::MAX);
    }

    fn put(&mut self, key: u8, len: usize, chunks: usize, expires: Option<u64>, time: u64) {
        let data = content(key, len, time);
        let meta = BlobMeta {
            props: Bytes::from(format!("p{time}")),
            time_ms: time,
            expires_ms: expires,
        };
        let got = self
            .store()
            .put_blob(&key_bytes(key), meta, &chunked(&data, chunks))
            .unwrap();
        let want = match self.model.blobs.get(&key) {
            Some(MBlob::Live { .. }) => PutOutcome::AlreadyExists,
            Some(MBlob::Deleted { .. }) => PutOutcome::Deleted,
            None => {
                self.model.blobs.insert(
                    key,
                    MBlob::Live {
                        data,
                        time,
                        expires,
                    },
                );
                self.model.append(Op::PutBlob, key, len as u64, 0);
                PutOutcome::Stored
            }
        };
        assert_eq!(got, want);
    }

    fn delete(&mut self, key: u8, time: u64) {
        let got = self.store().delete_blob(&key_bytes(key), time).unwrap();
        let want = match self.model.blobs.get(&key) {
            Some(MBlob::Deleted { .. }) => DeleteOutcome::AlreadyDeleted,
            _ => {
                let seq = self.model.append(Op::DeleteBlob, key, 0, 0);
                self.model.blobs.insert(key, MBlob::Deleted { time, seq });
                DeleteOutcome::Deleted
            }
        };
        assert_eq!(got, want);
    }

    fn check_get(&self, key: u8, now: u64) {
        let got = self.store().get_blob(&key_bytes(key), now).unwrap();
        match (self.model.blobs.get(&key), got) {
            (None, BlobLookup::NotFound) => {}
            (Some(MBlob::Deleted { time, .. }), BlobLookup::Deleted { time_ms }) => {
                assert_eq!(*time, time_ms)
            }
            (
                Some(MBlob::Live {
                    data,
                    time,
                    expires,
                }),
                BlobLookup::Found(rec) | BlobLookup::Expired(rec),
            ) => {
                let expired = expires.is_some_and(|e| now >= e);
                let again = self.store().get_blob(&key_bytes(key), now).unwrap();
                assert_eq!(expired, matches!(again, BlobLookup::Expired(_)));
                assert_eq!(rec.size, data.len() as u64);
                assert_eq!(rec.meta.time_ms, *time);
                assert_eq!(rec.meta.expires_ms, *expires);
                assert_eq!(rec.meta.props, Bytes::from(format!("p{time}")));
            }
            (want, got) => panic!("get {key}: model {want:?}, store {got:?}"),
        }
    }

    fn check_read(&self, key: u8, start: u64, end: u64) {
        let Some(MBlob::Live { data, .. }) = self.model.blobs.get(&key) else {
            return;
        };
        let (BlobLookup::Found(rec) | BlobLookup::Expired(rec)) =
            self.store().get_blob(&key_bytes(key), 0).unwrap()
        else {
            panic!("live blob {key} missing")
        };
        let mut got = Vec::new();
        for piece in self.store().read_blob(&rec, start..end).unwrap() {
            let piece = piece.unwrap();
            assert!(!piece.is_empty() && piece.len() <= 7000);
            got.extend_from_slice(&piece);
        }
        let (s, e) = (
            (start as usize).min(data.len()),
            (end as usize).min(data.len()),
        );
        assert_eq!(got, data[s..e.max(s)]);
    }

    fn doc_version(&self, key: u8) -> Option<u64> {
        self.model.docs.get(&key).map(|d| match d {
            MDoc::Live { version, .. } | MDoc::Removed { version, .. } => *version,
        })
    }

    fn put_doc(&mut self, key: u8, version: u64, len: usize, time: u64) {
        let json = content(key, len, time + 1);
        let got = self
            .store()
            .put_doc(&key_bytes(key), version, time, Bytes::from(json.clone()))
            .unwrap();
        self.apply_doc(
            key,
            version,
            got,
            MDoc::Live {
                version,
                time,
                json,
            },
            Op::PutDoc,
            len as u64,
        );
    }

    fn remove_doc(&mut self, key: u8, version: u64, time: u64) {
        let got = self
            .store()
            .remove_doc(&key_bytes(key), version, time)
            .unwrap();
        self.apply_doc(
            key,
            version,
            got,
            MDoc::Removed {
                version,
                time,
                seq: 0,
            },
            Op::RemoveDoc,
            0,
        );
    }

    fn apply_doc(&mut self, key: u8, version: u64, got: DocOutcome, new: MDoc, op: Op, size: u64) {
        match self.doc_version(key) {
            Some(current) if version <= current => assert_eq!(got, DocOutcome::Stale { current }),
            _ => {
                assert_eq!(got, DocOutcome::Applied);
                let seq = self.model.append(op, key, size, version);
                let new = match new {
                    MDoc::Removed { version, time, .. } => MDoc::Removed { version, time, seq },
                    live => live,
                };
                self.model.docs.insert(key, new);
            }
        }
    }

    fn check_doc(&self, key: u8) {
        let got = self.store().get_doc(&key_bytes(key)).unwrap();
        let want = match self.model.docs.get(&key) {
            None => DocLookup::NotFound,
            Some(MDoc::Removed { version, time, .. }) => DocLookup::Removed {
                version: *version,
                time_ms: *time,
            },
            Some(MDoc::Live {
                version,
                time,
                json,
            }) => DocLookup::Found {
                version: *version,
                time_ms: *time,
                json: Bytes::from(json.clone()),
            },
        };
        assert_eq!(summary(&got), summary(&want), "doc {key}");
    }

    /// The feed reader, which keeps its place in the log between pages (through compactions
    /// too), gives the page the change feed gives for its cursor.
    fn check_feed_page(&mut self, limit: usize) {
        let reader = self.feed.as_mut().unwrap();
        let after = reader.cursor();
        let got = reader.next_page(limit).unwrap();
        let want = self.store.as_ref().unwrap().changes(after, limit).unwrap();
        assert_eq!(got.changes, want.changes);
        assert_eq!(got.next, want.next);
        assert_eq!(reader.cursor(), want.next);
    }

    /// Holds no clone of the store across its crash or close.
    fn drop_feed_reader(&mut self) {
        if let Some(reader) = self.feed.take() {
            self.feed_cursor = reader.cursor();
        }
    }

    /// The whole feed must equal the model's log; a page from the `from`-th change must be the
    /// following `limit` entries.
    fn check_changes(&self, from: usize, limit: usize) {
        let all = self
            .store()
            .changes(Cursor::START, usize::MAX)
            .unwrap()
            .changes;
        let got: Vec<_> = all
            .iter()
            .map(|c| (c.op, c.key.to_vec(), c.size, c.version, c.cursor.sequence))
            .collect();
        assert_eq!(got, self.model.feed());
        let after = if from == 0 || all.is_empty() {
            Cursor::START
        } else {
            all[(from - 1) % all.len()].cursor
        };
        let start = all
            .iter()
            .position(|c| c.cursor > after)
            .unwrap_or(all.len());
        let page = self.store().changes(after, limit).unwrap();
        let want = &all[start..(start.saturating_add(limit)).min(all.len())];
        assert_eq!(page.changes, want);
        // A page that is not full reached the end of the feed: it moves the cursor to the
        // durable end (past records the feed leaves out). A full page stops at its last change.
        let durable = self.store().stats().durable_cursor;
        // (A page of 0 changes does not look and does not move.)
        let next = if limit == 0 || want.len() == limit {
            want.last().map_or(
                Cursor {
                    sequence: after.sequence,
                    ..durable
                },
                |c| c.cursor,
            )
        } else {
            durable
        };
        assert_eq!(page.next, next);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(steps in proptest::collection::vec(step(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts()).unwrap();
        let feed = Some(store.feed(Cursor::START));
        let mut h = Harness { dir, store: Some(store), feed, feed_cursor: Cursor::START, model: Model::default() };
        for s in steps {
            h.run(s);
        }
        // Whatever the sequence, the store must come back intact from a crash at its end.
        h.run(Step::Crash);
    }
}

/// Opens the store, waiting (up to 5 s) while a background checkpoint thread of the dropped store
/// still holds the directory's lock: in a real crash the kernel releases it at once.
fn open_when_unlocked(dir: &std::path::Path) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Store::open(dir, opts()) {
            Err(larder_store::Error::Unavailable(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other.unwrap(),
        }
    }
}
