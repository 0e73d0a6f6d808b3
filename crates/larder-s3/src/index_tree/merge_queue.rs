//! The leaves a frontend has to merge (`merge.rs`), merged by a few tasks (`TASKS`), one
//! leaf after another each, beside the foreground writes rather than among them.
//!
//! A merge is seven or eight read-modify-writes (list it, seal it, extend its left neighbour,
//! drop its hint, clear its garbage, mark it finished, and reads to find and size its left
//! neighbour). A DeleteObjects of a thousand names thins or empties dozens of leaves at once,
//! and each of them started its merge in a task of its own: the merges of a mass delete
//! outnumbered its own writes several times over, ran all at once, and took the deletes'
//! storage time (`benchmarks/s3-deleted-range`: deletes 2.5 times as long). Queued, the
//! deletes answer as fast as without merges and the merges follow them, in arrival order. One
//! task alone took ~50 ms a merge there (each step waits for a quorum's sync), ~12 s for the
//! ~220 merges of 7,000 deletes; a few at once share those syncs.
//! A merge that cannot go on (its left neighbour is being merged, split or sealed) settles
//! that first, as before (`IndexTree::merge`).
//!
//! The queue is bounded: past `MAX_QUEUED` a leaf is not queued, and the next listing that
//! walks it (or delete that empties it) queues it again. A leaf already queued is not queued
//! twice.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::S3Error;
use crate::store::Records;

use super::IndexTree;

/// Leaves waiting at most.
const MAX_QUEUED: usize = 4096;
/// Tasks that merge queued leaves at most at once.
const TASKS: usize = 4;

/// A leaf of a bucket: (bucket, leaf ID).
type Due = (String, String);

#[derive(Default)]
pub(super) struct MergeQueue(Mutex<Pending>);

#[derive(Default)]
struct Pending {
    order: VecDeque<Due>,
    queued: HashSet<Due>,
    /// Tasks that merge them running now.
    tasks: usize,
}

impl MergeQueue {
    /// Queues `due`; with whether a task has to be started for it (fewer than `TASKS` run).
    fn push(&self, due: Due) -> bool {
        let mut pending = self.0.lock();
        if pending.order.len() >= MAX_QUEUED || !pending.queued.insert(due.clone()) {
            return false;
        }
        pending.order.push_back(due);
        let start = pending.tasks < TASKS;
        pending.tasks += usize::from(start);
        start
    }

    /// The next leaf to merge, or `None` (and the task ends) when there is none.
    fn next(&self) -> Option<Due> {
        let mut pending = self.0.lock();
        let next = pending.order.pop_front();
        match &next {
            Some(due) => {
                pending.queued.remove(due);
            }
            None => pending.tasks = pending.tasks.saturating_sub(1),
        }
        next
    }

    /// Leaves waiting now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().order.len()
    }
}

impl IndexTree {
    /// Merges leaf `id` of `bucket` (a delete thinned it, or a listing walked it) when this
    /// frontend's merge task comes to it.
    pub fn merge_later(self: &Arc<Self>, records: &Arc<Records>, bucket: &str, id: &str) {
        if !self.queue.push((bucket.to_owned(), id.to_owned())) {
            return;
        }
        let (tree, records) = (self.clone(), records.clone());
        tokio::spawn(async move {
            let running = Running(&tree.queue);
            // Ends only with the queue empty (`next` says so under the same lock `push` takes).
            while let Some((bucket, id)) = running.0.next() {
                match tree.merge(&records, &bucket, &id).await {
                    // Deleted meanwhile: its leaves went with it.
                    Ok(_) | Err(S3Error::NoSuchBucket) => {}
                    Err(err) => {
                        tracing::debug!(%err, bucket, leaf = id, "an index merge failed; the next delete or listing there tries again");
                    }
                }
            }
            std::mem::forget(running);
        });
    }
}

/// A merge task, while it runs: if it ends otherwise than by finding the queue empty (a
/// panic, the runtime shutting down), it is counted out, so that the next leaf queued can
/// start another.
struct Running<'a>(&'a MergeQueue);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut pending = self.0 .0.lock();
        pending.tasks = pending.tasks.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_queued_once_and_a_few_tasks_run_while_any_wait() {
        let queue = MergeQueue::default();
        let due = |id: &str| ("b".to_owned(), id.to_owned());
        for i in 0..TASKS {
            assert!(
                queue.push(due(&format!("t{i}"))),
                "a task for each of the first"
            );
        }
        assert!(!queue.push(due("a")), "{TASKS} run: none started");
        assert!(!queue.push(due("a")), "already queued");
        assert_eq!(queue.len(), TASKS + 1);
        for i in 0..TASKS {
            assert_eq!(queue.next(), Some(due(&format!("t{i}"))));
        }
        assert_eq!(queue.next(), Some(due("a")));
        assert!(
            !queue.push(due("a")),
            "queued again once taken, for the tasks running"
        );
        assert_eq!(queue.next(), Some(due("a")));
        assert_eq!(queue.next(), None, "empty: a task ends");
        assert!(queue.push(due("c")), "one ended: a new task for the next");
        for i in 0..MAX_QUEUED + 10 {
            queue.push(due(&i.to_string()));
        }
        assert_eq!(queue.len(), MAX_QUEUED, "bounded");
    }
}
