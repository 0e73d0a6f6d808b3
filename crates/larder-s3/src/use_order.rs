//! The order in which a cache's entries were last used, oldest first: what the record cache
//! (`record_cache.rs`) and the body cache (`body_cache.rs`) forget first. An ordered index of
//! use stamps, so finding the least recently used entry is no scan of every entry.

use std::collections::BTreeMap;

pub struct UseOrder<K> {
    /// Bumped at every use: the least recently used entry has the lowest stamp.
    clock: u64,
    by_use: BTreeMap<u64, K>,
}

impl<K> Default for UseOrder<K> {
    fn default() -> Self {
        UseOrder {
            clock: 0,
            by_use: BTreeMap::new(),
        }
    }
}

impl<K> UseOrder<K> {
    /// Notes a use of `key`, whose last use was stamped `before` (if it was kept); returns the
    /// new stamp, for the caller to keep with the entry.
    pub fn used(&mut self, key: K, before: Option<u64>) -> u64 {
        if let Some(before) = before {
            self.by_use.remove(&before);
        }
        self.clock += 1;
        self.by_use.insert(self.clock, key);
        self.clock
    }

    /// Forgets the use stamped `stamp` (its entry is gone).
    pub fn forget(&mut self, stamp: u64) {
        self.by_use.remove(&stamp);
    }

    /// Takes the least recently used key out of the order.
    pub fn oldest(&mut self) -> Option<K> {
        self.by_use.pop_first().map(|(_, key)| key)
    }

    /// How many uses are noted: one per kept entry.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_use.len()
    }
}
