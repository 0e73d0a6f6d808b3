//! The MD5 of a body (its ETag), hashed in SIMD lanes together with other uploads' bodies, on a
//! thread of its own once the body is large.
//!
//! Why: MD5 is one serial chain per message, about 0.6 GB/s on a core here, and the ETag of a
//! 4 MiB PutObject took 46 % of the frontend's CPU (`benchmarks/s3-compare/reading.md`).
//! Concurrent uploads are independent messages: `md5-many` hashes up to 16 of them at once in
//! one core's SIMD lanes (7.4 GB/s over 16 streams on this AVX-512 host, 9× a stream alone).
//! MinIO does the same with md5-simd.
//!
//! A body is hashed inline, as one stream, until it passes [`LANES_FROM`] bytes: a small body
//! never waits on another thread. Past that, its pieces are queued (shared `Bytes`, not copied)
//! for the `larder-md5` thread. A body is listed for a round once [`LIST_FROM`] bytes are
//! queued (or when it is finished); a round hashes its bodies in lockstep, [`QUANTUM`] bytes of
//! each at a time. A body's reader waits while [`QUEUED_MAX`] of its bytes are queued and not
//! hashed: the hashing's memory budget per upload, and backpressure when the thread falls
//! behind. That thread takes this CPU-heavy work off the async workers.
//!
//! Lock order: the thread's list of waiting bodies, then a body's own lock. No code holds a
//! body's lock while it takes the list's.
//!
//! One thread serves the process, so a panic in a round (a bug here or in `md5-many`) must not
//! take it down: every later large upload would wait for good. The round's bodies are failed
//! instead (their readers stop waiting and `finish` answers [`LanesFailed`], which the upload
//! turns into a 500 and stores nothing under the name), and the thread goes on with the next.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use md5_many::{Md5Many, Md5State};
use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::{oneshot, Notify};

/// Bytes of a body hashed inline before its later pieces go to the lanes.
pub const LANES_FROM: u64 = 256 * 1024;
const _: () = assert!(LANES_FROM.is_multiple_of(64));
/// Bytes of one body queued for the lanes and not hashed yet, past which its reader waits.
pub const QUEUED_MAX: usize = 1 << 20;
/// Bodies taken into one round of lanes: the largest lockstep size (three groups of 16
/// AVX-512 lanes).
const ROUND_BODIES: usize = LOCKSTEP_SIZES[LOCKSTEP_SIZES.len() - 1];
/// Bodies a round waits for (AVX2's lanes), at most [`GATHER`] after the first is listed.
const GATHER_BODIES: usize = 8;
/// How long a round may wait for more bodies. A body's digest waits at most this much more.
const GATHER: Duration = Duration::from_millis(2);
/// Bytes a body has queued before it is listed for a round.
const LIST_FROM: usize = 4 * QUANTUM;

/// The `larder-md5` thread panicked in a round that held this body: its digest is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanesFailed;

impl std::fmt::Display for LanesFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the body's MD5 was lost to a panic on the larder-md5 thread")
    }
}

/// The MD5 of one body, fed piece by piece.
pub enum EtagHasher {
    Inline(Md5State),
    Lanes(LaneStream),
}

impl Default for EtagHasher {
    fn default() -> Self {
        EtagHasher::Inline(Md5State::new())
    }
}

impl EtagHasher {
    /// Adds `piece` to the body. Waits only when this body's queue for the lanes is full (and
    /// not at all once the body has failed: `finish` tells).
    pub async fn update(&mut self, piece: &Bytes) {
        match self {
            EtagHasher::Inline(state) => {
                // Inline up to exactly LANES_FROM bytes (whole blocks), the rest in the lanes.
                let room = LANES_FROM.saturating_sub(state.bytes_hashed());
                let room = usize::try_from(room).unwrap_or(usize::MAX);
                if piece.len() <= room {
                    state.update(piece);
                    return;
                }
                state.update(&piece[..room]);
                let stream = LaneStream::start(*state);
                stream.push(piece.slice(room..)).await;
                *self = EtagHasher::Lanes(stream);
            }
            EtagHasher::Lanes(stream) => stream.push(piece.clone()).await,
        }
    }

    /// The MD5 of every piece given, once all are hashed.
    pub async fn finish(self) -> Result<[u8; 16], LanesFailed> {
        match self {
            EtagHasher::Inline(state) => Ok(state.finalize()),
            EtagHasher::Lanes(stream) => stream.finish().await,
        }
    }
}

/// One body's place in the lanes.
pub struct LaneStream {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Body>,
    /// Told when some of this body's queued bytes have been hashed.
    room: Notify,
}

struct Body {
    /// `None` while the body is in a round.
    state: Option<Md5State>,
    pieces: VecDeque<Bytes>,
    /// Bytes given and not hashed yet (in `pieces` or in a round).
    queued: usize,
    /// On the thread's list of bodies to hash, or in a round.
    listed: bool,
    /// Where the digest goes once every piece is hashed (set by `finish`).
    done: Option<oneshot::Sender<[u8; 16]>>,
    /// A round holding this body panicked: its state is gone, its pieces are dropped.
    failed: bool,
}

impl Shared {
    fn body(&self) -> MutexGuard<'_, Body> {
        self.inner.lock()
    }
}

impl Body {
    /// Whether a round should not wait for more bodies on this one's account: its reader is
    /// about to wait for room, or its digest is awaited.
    fn is_pressing(&self) -> bool {
        self.done.is_some() || self.queued >= QUEUED_MAX / 2
    }
}

impl LaneStream {
    fn start(state: Md5State) -> LaneStream {
        let body = Body {
            state: Some(state),
            pieces: VecDeque::new(),
            queued: 0,
            listed: false,
            done: None,
            failed: false,
        };
        LaneStream {
            shared: Arc::new(Shared {
                inner: Mutex::new(body),
                room: Notify::new(),
            }),
        }
    }

    async fn push(&self, piece: Bytes) {
        loop {
            let room = self.shared.room.notified();
            {
                let mut body = self.shared.body();
                if body.failed {
                    return;
                }
                if body.queued < QUEUED_MAX {
                    body.queued = body.queued.saturating_add(piece.len());
                    body.pieces.push_back(piece);
                    if !body.listed && body.queued >= LIST_FROM {
                        body.listed = true;
                        drop(body);
                        lanes().list(self.shared.clone());
                    } else if body.listed && body.is_pressing() {
                        drop(body);
                        lanes().nudge();
                    }
                    return;
                }
            }
            room.await;
        }
    }

    async fn finish(self) -> Result<[u8; 16], LanesFailed> {
        let answer = {
            let mut body = self.shared.body();
            if body.failed {
                return Err(LanesFailed);
            }
            if !body.listed && body.queued < QUANTUM {
                // Less than a quantum is left, if anything: hashed here.
                let mut state = body.state.expect("a body not in a round has its state");
                body.pieces.iter().for_each(|p| state.update(p));
                return Ok(state.finalize());
            }
            let (send, answer) = oneshot::channel();
            body.done = Some(send);
            match body.listed {
                true => {
                    drop(body);
                    lanes().nudge();
                }
                false => {
                    body.listed = true;
                    drop(body);
                    lanes().list(self.shared.clone());
                }
            }
            answer
        };
        // The thread answers every body it holds a `done` of, or drops the `done` of a body
        // it failed.
        answer.await.map_err(|_| LanesFailed)
    }
}

/// The thread's list of bodies with pieces to hash.
struct Lanes {
    waiting: Mutex<VecDeque<Arc<Shared>>>,
    wake: Condvar,
}

fn lanes() -> &'static Lanes {
    #[cfg(test)]
    if let Some(own) = tests::OWN_LANES.with(std::cell::Cell::get) {
        return own;
    }
    static LANES: OnceLock<&'static Lanes> = OnceLock::new();
    LANES.get_or_init(start_lanes)
}

/// Lanes and their thread, for the life of the process.
fn start_lanes() -> &'static Lanes {
    let lanes: &'static Lanes = Box::leak(Box::new(Lanes {
        waiting: Mutex::new(VecDeque::new()),
        wake: Condvar::new(),
    }));
    std::thread::Builder::new()
        .name("larder-md5".into())
        .spawn(move || lanes.run())
        .expect("cannot start the larder-md5 thread");
    lanes
}

impl Lanes {
    fn list(&self, body: Arc<Shared>) {
        let mut waiting = self.waiting.lock();
        waiting.push_back(body);
        self.wake.notify_one();
    }

    /// Wakes a round waiting for more bodies, to look again whether one is pressing.
    fn nudge(&self) {
        let _waiting = self.waiting.lock();
        self.wake.notify_one();
    }

    fn run(&self) {
        let engine = Md5Many::new();
        loop {
            let round = self.next_round();
            let held = round.clone();
            if catch_unwind(AssertUnwindSafe(|| self.hash_round(engine, round))).is_err() {
                tracing::error!(
                    bodies = held.len(),
                    "a round of MD5 lanes panicked; its uploads fail"
                );
                held.iter().for_each(|shared| fail(shared));
            }
        }
    }

    /// The bodies of the next round: every one waiting, once [`GATHER_BODIES`] are, or one
    /// is pressing, or [`GATHER`] has passed since the first. Bodies then fill lanes together
    /// rather than each being hashed alone as soon as it has a quantum, and a lone fast upload
    /// is not held to one round per `GATHER`.
    fn next_round(&self) -> Vec<Arc<Shared>> {
        let mut waiting = self.waiting.lock();
        while waiting.is_empty() {
            self.wake.wait(&mut waiting);
        }
        let deadline = Instant::now() + GATHER;
        while waiting.len() < GATHER_BODIES && !waiting.iter().any(|b| b.body().is_pressing()) {
            if self.wake.wait_until(&mut waiting, deadline).timed_out() {
                break;
            }
        }
        let n = waiting.len().min(ROUND_BODIES);
        waiting.drain(..n).collect()
    }

    /// Hashes the bodies of `round` in lockstep, [`QUANTUM`] bytes of each at a time, then
    /// gives each its state back. A body's last bytes short of a quantum wait for more, or, when
    /// the body is finished, are hashed as one stream and the digest sent.
    fn hash_round(&self, engine: Md5Many, round: Vec<Arc<Shared>>) {
        // A failed body may still be on the list: it has nothing left to hash.
        let round: Vec<Arc<Shared>> = round.into_iter().filter(|b| !b.body().failed).collect();
        let mut states = Vec::with_capacity(round.len());
        let mut feeds = Vec::with_capacity(round.len());
        for shared in &round {
            let mut body = shared.body();
            states.push(body.state.take().expect("a listed body is in one round"));
            feeds.push(Feed(std::mem::take(&mut body.pieces)));
        }
        #[cfg(test)]
        tests::panic_if_asked(&feeds);
        let mut hashed = vec![0usize; round.len()];
        loop {
            let group: Vec<usize> = (0..feeds.len())
                .filter(|&i| feeds[i].len() >= QUANTUM)
                .collect();
            if group.is_empty() {
                break;
            }
            let inputs: Vec<Bytes> = group.iter().map(|&i| feeds[i].take(QUANTUM)).collect();
            let mut group_states: Vec<Md5State> = group.iter().map(|&i| states[i]).collect();
            hash_in_lanes(engine, &mut group_states, &inputs);
            for (k, &i) in group.iter().enumerate() {
                states[i] = group_states[k];
                hashed[i] += QUANTUM;
            }
        }
        let bodies = round.into_iter().zip(states).zip(feeds).zip(hashed);
        for (((shared, state), feed), hashed) in bodies {
            self.give_back(shared, state, feed, hashed);
        }
    }

    /// Returns a body's state and its unhashed bytes (ahead of any that came meanwhile).
    fn give_back(&self, shared: Arc<Shared>, mut state: Md5State, feed: Feed, hashed: usize) {
        let mut body = shared.body();
        let mut pieces = feed.0;
        pieces.append(&mut body.pieces);
        let left: usize = pieces.iter().map(Bytes::len).sum();
        body.queued = body.queued.saturating_sub(hashed);
        body.listed = left >= LIST_FROM || (left >= QUANTUM && body.done.is_some());
        if !body.listed && body.done.is_some() {
            pieces.iter().for_each(|p| state.update(p));
            body.queued = 0;
            pieces.clear();
            if let Some(done) = body.done.take() {
                let _ = done.send(state.finalize());
            }
        }
        body.state = Some(state);
        body.pieces = pieces;
        let again = body.listed;
        drop(body);
        shared.room.notify_one();
        if again {
            self.list(shared);
        }
    }
}

/// Fails a body of a round that panicked: drops its pieces and its `done` (its `finish` answers
/// [`LanesFailed`]) and wakes its reader, which then queues nothing more.
fn fail(shared: &Shared) {
    let mut body = shared.body();
    body.failed = true;
    body.pieces.clear();
    body.queued = 0;
    body.listed = false;
    body.done = None;
    drop(body);
    shared.room.notify_one();
}

/// Bytes hashed of each body per step of a round: a multiple of MD5's 64-byte block, so a
/// body's state stays block-aligned between steps (what md5-many's lockstep kernels need).
const QUANTUM: usize = 16 * 1024;

/// Group sizes md5-many hashes in lockstep at full speed (AVX2's 8 lanes, AVX-512's 16, and
/// two or three groups of 16 interleaved); other sizes fall to a path 3-10× slower here.
const LOCKSTEP_SIZES: [usize; 4] = [8, 16, 32, 48];

/// Hashes `inputs[i]` (each [`QUANTUM`] bytes) into `states[i]`: a lone body as one stream,
/// more in lanes, the group filled up with idle lanes to a lockstep size.
fn hash_in_lanes(engine: Md5Many, states: &mut [Md5State], inputs: &[Bytes]) {
    static IDLE: [u8; QUANTUM] = [0; QUANTUM];
    if let [input] = inputs {
        states[0].update(input);
        return;
    }
    for (states, inputs) in states
        .chunks_mut(ROUND_BODIES)
        .zip(inputs.chunks(ROUND_BODIES))
    {
        let size = LOCKSTEP_SIZES
            .into_iter()
            .find(|&size| size >= states.len())
            .unwrap_or(states.len());
        let mut padded: Vec<Md5State> = states.to_vec();
        padded.resize(size, Md5State::new());
        let mut refs: Vec<&[u8]> = inputs.iter().map(|b| &b[..]).collect();
        refs.resize(size, &IDLE[..]);
        engine.update_many(&mut padded, &refs);
        states.copy_from_slice(&padded[..states.len()]);
    }
}

/// A body's queued pieces, taken from the front in contiguous runs.
struct Feed(VecDeque<Bytes>);

impl Feed {
    fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    /// The next `n` bytes (there are at least `n`): a slice of the first piece when it holds
    /// them, else copied from the pieces they span.
    fn take(&mut self, n: usize) -> Bytes {
        let first = self.0.front_mut().expect("a feed with bytes has a piece");
        if first.len() >= n {
            let run = first.split_to(n);
            if first.is_empty() {
                self.0.pop_front();
            }
            return run;
        }
        let mut run = BytesMut::with_capacity(n);
        while run.len() < n {
            let piece = self.0.front_mut().expect("a feed with bytes has a piece");
            let part = piece.split_to(piece.len().min(n - run.len()));
            run.extend_from_slice(&part);
            if piece.is_empty() {
                self.0.pop_front();
            }
        }
        run.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::{Digest, Md5};
    use proptest::prelude::*;

    /// A body whose queued bytes start with this panics the round that takes it (the only way
    /// to test what a bug on the thread does; no other test's bodies hold these bytes).
    const PANIC_MARK: &[u8; 16] = b"\xffpanic-md5-lanes";

    thread_local! {
        /// Lanes of this test thread's own, when set: a round made to panic fails every body
        /// in it, and the process's lanes hash other tests' bodies beside it (a test of
        /// `blobs.rs` failed so once).
        pub(super) static OWN_LANES: std::cell::Cell<Option<&'static Lanes>> =
            const { std::cell::Cell::new(None) };
    }

    pub(super) fn panic_if_asked(feeds: &[Feed]) {
        let marked = |feed: &Feed| feed.0.front().is_some_and(|p| p.starts_with(PANIC_MARK));
        if feeds.iter().any(marked) {
            panic!("a round was asked to panic");
        }
    }

    fn reference(bodies: &[Vec<Bytes>]) -> Vec<[u8; 16]> {
        bodies
            .iter()
            .map(|pieces| {
                let mut md5 = Md5::new();
                pieces.iter().for_each(|p| md5.update(p));
                md5.finalize().into()
            })
            .collect()
    }

    /// Bodies cut into pieces of random sizes (some empty, some past a block or the queue's
    /// budget), hashed concurrently: each body's pieces in order, the bodies interleaved.
    fn bodies() -> impl Strategy<Value = Vec<Vec<Bytes>>> {
        let piece = prop_oneof![
            4 => (0usize..200).prop_map(|n| n),
            4 => (1usize..70_000).prop_map(|n| n),
            1 => (200_000usize..1_300_000).prop_map(|n| n),
        ];
        let body = (any::<u8>(), prop::collection::vec(piece, 0..12)).prop_map(|(seed, sizes)| {
            sizes
                .into_iter()
                .enumerate()
                .map(|(i, n)| {
                    let byte = seed.wrapping_add(i as u8);
                    Bytes::from((0..n).map(|j| byte ^ (j as u8)).collect::<Vec<u8>>())
                })
                .collect::<Vec<Bytes>>()
        });
        prop::collection::vec(body, 1..24)
    }

    fn hash_concurrently(bodies: &[Vec<Bytes>]) -> Vec<[u8; 16]> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        runtime.block_on(async {
            let tasks: Vec<_> = bodies
                .iter()
                .cloned()
                .map(|pieces| {
                    tokio::spawn(async move {
                        let mut hasher = EtagHasher::default();
                        for piece in &pieces {
                            hasher.update(piece).await;
                            tokio::task::yield_now().await;
                        }
                        hasher.finish().await.unwrap()
                    })
                })
                .collect();
            let mut digests = Vec::new();
            for task in tasks {
                digests.push(task.await.unwrap());
            }
            digests
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn lanes_hash_every_body_as_md5_does(bodies in bodies()) {
            prop_assert_eq!(hash_concurrently(&bodies), reference(&bodies));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Every group size (padded to a lockstep size, or cut into several), from states
        /// already some blocks in: each lane as its stream alone.
        #[test]
        fn a_group_in_lanes_hashes_each_body_as_alone(
            size in 1usize..60, seed in any::<u8>(), blocks_before in 0usize..4,
        ) {
            let before = vec![seed; blocks_before * 64];
            let inputs: Vec<Bytes> = (0..size)
                .map(|i| Bytes::from(vec![seed.wrapping_add(i as u8); QUANTUM]))
                .collect();
            let mut states: Vec<Md5State> = (0..size)
                .map(|_| { let mut s = Md5State::new(); s.update(&before); s })
                .collect();
            let mut alone = states.clone();
            hash_in_lanes(Md5Many::new(), &mut states, &inputs);
            for (state, input) in alone.iter_mut().zip(&inputs) {
                state.update(input);
            }
            let digests: Vec<_> = states.iter().map(Md5State::finalize).collect();
            let expected: Vec<_> = alone.iter().map(Md5State::finalize).collect();
            prop_assert_eq!(digests, expected);
        }

        /// A feed gives its bytes back in order, in runs of the sizes asked for.
        #[test]
        fn a_feed_takes_runs_in_order(sizes in prop::collection::vec(0usize..40_000, 1..10)) {
            let all: Vec<u8> = (0..sizes.iter().sum::<usize>()).map(|i| (i % 251) as u8).collect();
            let mut at = 0;
            let mut feed = Feed(sizes.iter().map(|&n| {
                let piece = Bytes::copy_from_slice(&all[at..at + n]);
                at += n;
                piece
            }).collect());
            let mut got = Vec::new();
            while feed.len() >= 1000 {
                got.extend_from_slice(&feed.take(1000));
            }
            feed.0.iter().for_each(|p| got.extend_from_slice(p));
            prop_assert_eq!(got, all);
        }
    }

    #[test]
    fn a_large_body_goes_to_the_lanes_and_a_small_one_stays_inline() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut small = EtagHasher::default();
            small.update(&Bytes::from(vec![1u8; 1000])).await;
            assert!(matches!(small, EtagHasher::Inline(_)));
            let mut large = EtagHasher::default();
            let piece = Bytes::from(vec![2u8; 100_000]);
            for _ in 0..4 {
                large.update(&piece).await;
            }
            assert!(matches!(large, EtagHasher::Lanes(_)));
            let mut md5 = Md5::new();
            (0..4).for_each(|_| md5.update(&piece));
            let digest = large.finish().await.unwrap();
            assert_eq!(digest, <[u8; 16]>::from(md5.finalize()));
        });
    }

    #[test]
    fn a_reader_waits_while_its_queue_is_full_and_goes_on_when_it_is_hashed() {
        // Pieces far past the budget: every push after the first waits for the thread, and
        // the queue never holds more than the budget plus one piece.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let stream = LaneStream::start(Md5State::new());
            let piece = Bytes::from(vec![3u8; QUEUED_MAX]);
            for _ in 0..6 {
                stream.push(piece.clone()).await;
                assert!(stream.shared.body().queued <= 2 * QUEUED_MAX);
            }
            let mut md5 = Md5::new();
            (0..6).for_each(|_| md5.update(&piece));
            assert_eq!(
                stream.finish().await.unwrap(),
                <[u8; 16]>::from(md5.finalize())
            );
        });
    }

    #[test]
    fn a_panic_in_a_round_fails_its_body_and_the_thread_goes_on() {
        // On this thread (the runtime below runs here), bodies go to lanes of their own.
        OWN_LANES.with(|own| own.set(Some(start_lanes())));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // A thread that died with the panic would leave these waiting for good.
        let within = Duration::from_secs(60);
        let test = async {
            // Past the inline part, the marked bytes are the first the lanes take.
            let mut doomed = EtagHasher::default();
            doomed
                .update(&Bytes::from(vec![4u8; LANES_FROM as usize]))
                .await;
            let mut marked = PANIC_MARK.to_vec();
            marked.resize(QUEUED_MAX, 5);
            // Far past the queue's budget: a reader left waiting by the panic would hang here.
            for _ in 0..4 {
                doomed.update(&Bytes::from(marked.clone())).await;
            }
            assert_eq!(doomed.finish().await, Err(LanesFailed));

            let piece = Bytes::from(vec![6u8; QUEUED_MAX]);
            let mut after = EtagHasher::default();
            for _ in 0..3 {
                after.update(&piece).await;
            }
            let mut md5 = Md5::new();
            (0..3).for_each(|_| md5.update(&piece));
            assert_eq!(after.finish().await, Ok(md5.finalize().into()));
        };
        runtime
            .block_on(async { tokio::time::timeout(within, test).await })
            .expect("the thread survives a panic and answers");
    }
}
