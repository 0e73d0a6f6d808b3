//! The change feed: durable records in log order, read straight from the segments.
//!
//! A change's cursor is the log position just past its record (where the next record starts), so
//! "records after a cursor" are simply the records found by scanning from it, and the durable
//! cursor bounds the scan without any per-record bookkeeping.

use crate::engine::Engine;
use crate::format::FILE_HEADER_LEN;
use crate::scan::{Found, Scanner};
use crate::types::{Change, ChangeBatch, Cursor, Result};

impl Engine {
    pub(crate) fn changes(&self, after: Cursor, limit: usize) -> Result<ChangeBatch> {
        let durable = self.index.read().durable;
        let segments = self.segments.read().clone();
        let mut batch = ChangeBatch {
            changes: Vec::new(),
            next: after,
        };
        for seg in segments
            .iter()
            .filter(|s| s.id >= after.segment && s.id <= durable.segment)
        {
            if batch.changes.len() >= limit {
                break;
            }
            let from = if seg.id == after.segment {
                after.offset.max(FILE_HEADER_LEN)
            } else {
                FILE_HEADER_LEN
            };
            // Sealed segments are complete; in the durable cursor's segment stop at the cursor.
            let to = if seg.id == durable.segment {
                durable.offset
            } else {
                seg.file.metadata()?.len()
            };
            scan_changes(&seg.file, seg.id, from, to, limit, &mut batch)?;
        }
        Ok(batch)
    }
}

fn scan_changes(
    file: &std::fs::File,
    segment: u32,
    mut pos: u64,
    to: u64,
    limit: usize,
    batch: &mut ChangeBatch,
) -> Result<()> {
    let mut scanner = Scanner::new(file, segment, to);
    while pos < to && batch.changes.len() < limit {
        let rec = match scanner.read_at(pos, false)? {
            Found::Valid(rec) | Found::BadData(rec, _) => rec,
            // Recovery already reported this region; step over it like recovery did.
            Found::Invalid => match scanner.resync(pos + 1)? {
                Some(next) => {
                    pos = next;
                    continue;
                }
                None => break,
            },
        };
        let cursor = Cursor {
            segment,
            offset: rec.end,
        };
        let info = rec.info;
        batch.changes.push(Change {
            cursor,
            op: info.op,
            key: info.key,
            time_ms: info.time_ms,
            version: info.version,
            size: info.size,
            expires_ms: info.expires_ms,
        });
        batch.next = cursor;
        pos = rec.end;
    }
    Ok(())
}
