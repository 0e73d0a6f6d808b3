//! What compaction knows of each sealed segment without reading it, so that a pass reads only
//! the segments that may have something to reclaim. Without it every pass (one a minute on a
//! storage node) read and verified every sealed byte of every replica: a node holding 100 GB
//! re-read 100 GB a minute to find, most of the time, nothing.
//!
//! Two halves:
//! - [`Notes`], kept in the index and written by `Index::apply` as records land: bytes a record
//!   made garbage (the record it replaced, or itself when it changed nothing), the earliest
//!   expiry of a blob written, the earliest time of a tombstone written. Per segment, since the
//!   pass last took them.
//! - [`Ledger`], kept by the compaction pass: what the last plan of each segment found (its
//!   garbage, when its next kept blob expires, when its kept tombstones come due), with the
//!   notes added since. A segment is planned again (read and verified) only when that says it
//!   may pay: garbage past the ratio, an expiry or a tombstone's retention passed, a horizon
//!   that moved for tombstones that were due but held back, or a plan older than
//!   [`REPLAN_AFTER_MS`] (a scrub: every checksum read again now and then). A segment never
//!   planned since the store opened is planned: the notes start at open, the log is older.
//!
//! Garbage of a replaced record is estimated from what the index keeps (key, properties and
//! data size); an estimate only decides when to read a segment, never what to drop: the plan
//! decides that from the segment's bytes, as before.

use std::collections::HashMap;

use crate::format::head_len;
use crate::types::CompactOptions;

/// A segment planned longer ago than this is planned again whatever its notes say.
pub(crate) const REPLAN_AFTER_MS: u64 = 24 * 3600 * 1000;

/// What landed in one segment since a pass last looked (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Notes {
    pub garbage: u64,
    pub earliest_expiry_ms: Option<u64>,
    pub earliest_tombstone_ms: Option<u64>,
}

fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The length of a record of `key_len` + `props_len` + `size` bytes.
pub(crate) fn record_len(key_len: usize, props_len: usize, size: u64) -> u64 {
    head_len(key_len, props_len, size).saturating_add(size)
}

/// Notes per segment, in the index.
#[derive(Default)]
pub(crate) struct SegmentNotes(HashMap<u32, Notes>);

impl SegmentNotes {
    pub fn garbage(&mut self, segment: u32, bytes: u64) {
        let notes = self.0.entry(segment).or_default();
        notes.garbage = notes.garbage.saturating_add(bytes);
    }

    pub fn expires(&mut self, segment: u32, at_ms: Option<u64>) {
        if at_ms.is_some() {
            let notes = self.0.entry(segment).or_default();
            notes.earliest_expiry_ms = earliest(notes.earliest_expiry_ms, at_ms);
        }
    }

    pub fn tombstone(&mut self, segment: u32, time_ms: u64) {
        let notes = self.0.entry(segment).or_default();
        notes.earliest_tombstone_ms = earliest(notes.earliest_tombstone_ms, Some(time_ms));
    }

    pub fn take(&mut self, segment: u32) -> Notes {
        self.0.remove(&segment).unwrap_or_default()
    }
}

/// What a plan of a segment found that decides when to plan it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Garbage bytes left in the segment (none after a rewrite), plus notes since.
    pub garbage: u64,
    /// The earliest expiry of a blob the segment kept.
    pub next_expiry_ms: Option<u64>,
    /// The earliest time of a kept tombstone that was not yet past its retention.
    pub next_tombstone_ms: Option<u64>,
    /// The smallest sequence of a kept tombstone past its retention that the horizon held
    /// back: a horizon at or past it may let it go.
    pub held_by_horizon: Option<u64>,
    /// Some kept tombstone past its retention and the horizon was held back by puts it
    /// shadows (in older segments: a rewrite of those may let it go).
    pub held_by_shadows: bool,
    pub planned_ms: u64,
}

/// One segment's kept records, as the plan saw them.
pub(crate) struct Kept {
    pub expires_ms: Option<u64>,
    /// `Some((time_ms, seq))` for a tombstone.
    pub tombstone: Option<(u64, u64)>,
}

impl Planned {
    pub fn after(
        garbage_left: u64,
        kept: impl Iterator<Item = Kept>,
        opts: &CompactOptions,
    ) -> Planned {
        let mut planned = Planned {
            garbage: garbage_left,
            next_expiry_ms: None,
            next_tombstone_ms: None,
            held_by_horizon: None,
            held_by_shadows: false,
            planned_ms: opts.now_ms,
        };
        for record in kept {
            planned.next_expiry_ms = earliest(planned.next_expiry_ms, record.expires_ms);
            let Some((time, seq)) = record.tombstone else {
                continue;
            };
            if !tombstone_due(time, opts) {
                planned.next_tombstone_ms = earliest(planned.next_tombstone_ms, Some(time));
            } else if opts.tombstone_horizon.is_some_and(|h| seq <= h) {
                planned.held_by_shadows = true;
            } else {
                planned.held_by_horizon = earliest(planned.held_by_horizon, Some(seq));
            }
        }
        planned
    }
}

fn tombstone_due(time_ms: u64, opts: &CompactOptions) -> bool {
    time_ms
        .checked_add(opts.tombstone_retention_ms)
        .is_some_and(|due| due <= opts.now_ms)
}

/// Per segment, what its last plan found (see the module docs). Held by the compaction pass.
#[derive(Default)]
pub(crate) struct Ledger(HashMap<u32, Planned>);

impl Ledger {
    /// Adds `notes` to what is known of `segment` and says whether to plan it now.
    /// `shadows_dropped`: a rewrite earlier in this pass dropped puts that tombstones shadowed,
    /// which may have freed held-back tombstones of later segments.
    pub fn should_plan(
        &mut self,
        segment: u32,
        payload: u64,
        notes: Notes,
        opts: &CompactOptions,
        shadows_dropped: bool,
    ) -> bool {
        let Some(p) = self.0.get_mut(&segment) else {
            return true;
        };
        p.garbage = p.garbage.saturating_add(notes.garbage);
        p.next_expiry_ms = earliest(p.next_expiry_ms, notes.earliest_expiry_ms);
        p.next_tombstone_ms = earliest(p.next_tombstone_ms, notes.earliest_tombstone_ms);
        let horizon = opts.tombstone_horizon;
        opts.now_ms >= p.planned_ms.saturating_add(REPLAN_AFTER_MS)
            || (p.garbage > 0 && p.garbage as f64 >= opts.min_garbage_ratio * payload as f64)
            || p.next_expiry_ms.is_some_and(|at| at <= opts.now_ms)
            || (horizon.is_some() && p.next_tombstone_ms.is_some_and(|t| tombstone_due(t, opts)))
            || p.held_by_horizon
                .is_some_and(|seq| horizon.is_some_and(|h| h >= seq))
            || (p.held_by_shadows && shadows_dropped)
    }

    pub fn planned(&mut self, segment: u32, planned: Planned) {
        self.0.insert(segment, planned);
    }

    /// The garbage `segment` is believed to hold (for reports of segments not read).
    pub fn garbage(&self, segment: u32) -> u64 {
        self.0.get(&segment).map_or(0, |p| p.garbage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(now_ms: u64) -> CompactOptions {
        CompactOptions {
            min_garbage_ratio: 0.5,
            now_ms,
            seal_active: false,
            max_bytes_per_sec: 0,
            tombstone_horizon: Some(10),
            tombstone_retention_ms: 1_000,
        }
    }

    fn kept(expires_ms: Option<u64>, tombstone: Option<(u64, u64)>) -> Kept {
        Kept {
            expires_ms,
            tombstone,
        }
    }

    #[test]
    fn a_segment_is_read_again_only_when_something_may_be_reclaimed() {
        let mut ledger = Ledger::default();
        let at = opts(5_000);
        assert!(
            ledger.should_plan(1, 1_000, Notes::default(), &at, false),
            "never planned"
        );
        ledger.planned(
            1,
            Planned::after(100, [kept(Some(9_000), None)].into_iter(), &at),
        );
        assert!(
            !ledger.should_plan(1, 1_000, Notes::default(), &at, false),
            "nothing new"
        );
        let some = Notes {
            garbage: 300,
            ..Notes::default()
        };
        assert!(
            !ledger.should_plan(1, 1_000, some, &at, false),
            "400 of 1,000 < 0.5"
        );
        assert!(
            ledger.should_plan(1, 1_000, some, &at, false),
            "700 of 1,000"
        );
        assert_eq!(ledger.garbage(1), 700);

        ledger.planned(
            1,
            Planned::after(0, [kept(Some(9_000), None)].into_iter(), &at),
        );
        assert!(!ledger.should_plan(1, 1_000, Notes::default(), &opts(8_999), false));
        assert!(
            ledger.should_plan(1, 1_000, Notes::default(), &opts(9_000), false),
            "expired"
        );
        assert!(
            ledger.should_plan(
                1,
                1_000,
                Notes::default(),
                &opts(5_000 + REPLAN_AFTER_MS),
                false
            ),
            "a scrub a day"
        );
    }

    #[test]
    fn tombstones_bring_a_segment_back_when_due_or_when_what_held_them_moved() {
        let mut ledger = Ledger::default();
        let at = opts(5_000);
        // Past their retention (4,000 + 1,000 <= 5,000): one held back by a put it shadows
        // (seq 5, within the horizon 10), one by the horizon (seq 12). One due at 6,500.
        let tombs = [
            kept(None, Some((4_000, 5))),
            kept(None, Some((4_000, 12))),
            kept(None, Some((5_500, 13))),
        ];
        ledger.planned(2, Planned::after(0, tombs.into_iter(), &at));
        assert!(!ledger.should_plan(2, 1_000, Notes::default(), &at, false));
        assert!(
            ledger.should_plan(2, 1_000, Notes::default(), &at, true),
            "shadows dropped"
        );
        let horizon = |h| CompactOptions {
            tombstone_horizon: Some(h),
            ..at.clone()
        };
        assert!(
            !ledger.should_plan(2, 1_000, Notes::default(), &horizon(11), false),
            "the horizon moved, not yet past the held tombstone"
        );
        assert!(
            ledger.should_plan(2, 1_000, Notes::default(), &horizon(12), false),
            "now past"
        );
        assert!(
            ledger.should_plan(2, 1_000, Notes::default(), &opts(6_500), false),
            "due"
        );
        let no_horizon = CompactOptions {
            tombstone_horizon: None,
            ..opts(6_500)
        };
        assert!(
            !ledger.should_plan(2, 1_000, Notes::default(), &no_horizon, false),
            "without a horizon no tombstone can go"
        );
        let new_tomb = Notes {
            earliest_tombstone_ms: Some(5_000),
            ..Notes::default()
        };
        let mut ledger = Ledger::default();
        ledger.planned(3, Planned::after(0, std::iter::empty(), &at));
        assert!(!ledger.should_plan(3, 1_000, new_tomb, &opts(5_999), false));
        assert!(ledger.should_plan(3, 1_000, Notes::default(), &opts(6_000), false));
    }
}
