//! One read-modify-write at a time per document in this frontend.
//!
//! An update reads the document, applies its operations and writes the result under a new
//! version. Two concurrent updates of one document would both read the same version and the
//! later write would silently drop the other's change (two increments adding one). Updates and
//! conditional writes therefore hold the document's lock from the read to the acknowledged write.
//! Frontends do not share locks: across frontends, the partition's primary refuses the write of
//! a read-modify-write that another one overtook (`DocRouter::write_serialised`); this lock is
//! the fast path that keeps one frontend's own updates from refusing each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Entries are dropped once nobody holds or waits for them, swept when the map has doubled.
#[derive(Default)]
pub struct DocLocks {
    locks: Mutex<Locks>,
}

#[derive(Default)]
struct Locks {
    by_id: HashMap<String, Weak<AsyncMutex<()>>>,
    sweep_at: usize,
}

impl DocLocks {
    /// Waits for, then holds, the lock of document `id` until the guard is dropped.
    pub async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().expect("no panics while held");
            let lock = match locks.by_id.get(id).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(AsyncMutex::new(()));
                    locks.by_id.insert(id.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            };
            if locks.by_id.len() > locks.sweep_at {
                locks.by_id.retain(|_, weak| weak.strong_count() > 0);
                locks.sweep_at = (2 * locks.by_id.len()).max(1024);
            }
            lock
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_document_and_no_leftover_entries() {
        let locks = Arc::new(DocLocks::default());
        let held = locks.lock("a").await;
        let other = locks.lock("b").await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { drop(locks.lock("a").await) })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "a second holder of one document's lock"
        );
        drop(held);
        waiter.await.unwrap();
        drop(other);
        for i in 0..3000 {
            drop(locks.lock(&format!("doc {i}")).await);
        }
        assert!(locks.locks.lock().unwrap().by_id.len() <= 2048);
    }
}
