//! Writers parked until a group commit covers their record.
//!
//! A condition variable would wake every waiter onto the log mutex, and each would then take it
//! in turn just to learn that its record is durable: a chain of context switches, one after the
//! other, that capped group commit at ~30k puts/s with 256 writers on 2 cores. Instead the leader
//! of a sync round tells each waiter its answer and wakes it directly; a waiter whose record the
//! round covered returns without touching the mutex.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};

use crate::api::Cursor;

const PENDING: u8 = 0;
const DURABLE: u8 = 1;
const RECHECK: u8 = 2;

/// What a woken writer learns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A sync covered its record.
    Durable,
    /// Its record is not covered yet, or the log failed: look at the log state again (and lead
    /// the next round if nobody does).
    Recheck,
}

pub(crate) struct Waiter {
    target: Cursor,
    state: AtomicU8,
    thread: Thread,
}

impl Waiter {
    /// A waiter for the current thread until `target` is durable.
    pub fn new(target: Cursor) -> Arc<Self> {
        Arc::new(Waiter {
            target,
            state: AtomicU8::new(PENDING),
            thread: thread::current(),
        })
    }

    /// Parks until woken (park may return spuriously, hence the loop).
    pub fn wait(&self) -> Wake {
        loop {
            match self.state.load(Ordering::Acquire) {
                PENDING => thread::park(),
                DURABLE => return Wake::Durable,
                _ => return Wake::Recheck,
            }
        }
    }

    fn wake(&self, how: Wake) {
        let state = match how {
            Wake::Durable => DURABLE,
            Wake::Recheck => RECHECK,
        };
        self.state.store(state, Ordering::Release);
        self.thread.unpark();
    }
}

/// Sorts `waiting` after a sync round that made everything up to `durable` durable: those it
/// covered are returned to be told so; of the rest, one is returned first, to be told to recheck
/// (it leads the next round), and the others keep waiting. When `all` is set (the log failed or
/// closed) every waiter is returned to recheck.
pub(crate) fn to_wake(
    waiting: &mut Vec<Arc<Waiter>>,
    durable: Cursor,
    all: bool,
) -> Vec<(Arc<Waiter>, Wake)> {
    if all {
        return waiting.drain(..).map(|w| (w, Wake::Recheck)).collect();
    }
    let mut covered = Vec::with_capacity(waiting.len());
    waiting.retain(|w| {
        let done = w.target <= durable;
        if done {
            covered.push((w.clone(), Wake::Durable));
        }
        !done
    });
    // The next leader is woken first, so its sync overlaps with waking the others.
    let mut wake: Vec<_> = waiting.pop().map(|w| (w, Wake::Recheck)).into_iter().collect();
    wake.extend(covered);
    wake
}

/// Wakes the waiters `to_wake` chose (call without holding the log mutex).
pub(crate) fn wake(waiters: Vec<(Arc<Waiter>, Wake)>) {
    for (waiter, how) in waiters {
        waiter.wake(how);
    }
}
