//! `GET .../changes`: a page of a replica's change feed (durable records only), which peers
//! replicate from. A peer names itself (`replica=<node id>`): its saved cursor (`saved=`, else
//! `after`) is its position in this replica's feed, from which the tombstone horizon is
//! computed (`horizon.rs`).

use http::{Response, StatusCode};
use larder_proto::{header as h, ChangeEntry, ChangePage};
use larder_store::{Cursor, Op, Store};

use crate::error::{Error, Result};
use crate::horizon::Serve;
use crate::node::blocking;
use crate::reply::{self, Body};
use crate::StorageNode;

/// Changes per page unless the query says otherwise, and the most it may ask for.
const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;

pub async fn page(
    node: &StorageNode,
    partition: u32,
    store: Store,
    query: &str,
) -> Result<Response<Body>> {
    let Query {
        after,
        saved,
        limit,
        replica,
        fresh,
    } = parse_query(query)?;
    // A bootstrapping replica is no source for others' replication (`DESIGN.md` 6.1).
    if replica.is_some()
        && node.replica_state(partition) == Some(larder_cluster::ReplicaState::Bootstrapping)
    {
        return Err(Error::Bootstrapping { partition });
    }
    if let Some(peer) = replica {
        let position = saved.map_or(after, |saved| position(saved, after));
        note_peer(node, partition, &store, (peer, fresh), (after, position))?;
        match node.horizons.may_serve(partition, peer) {
            Serve::Yes => {}
            Serve::NotChecked => return Err(Error::NotCheckedYet { partition }),
            Serve::Behind => return Err(Error::MustBeRebuilt { partition }),
        }
    }
    let head = store.durable_cursor().to_string();
    // Peers poll every partition every 200 ms: an idle one's empty page is answered here,
    // without the blocking pool's two thread wake-ups (7 % of a node's CPU under GET load).
    let batch = match store.idle_page(after) {
        Some(empty) => empty,
        None => blocking(move || store.changes(after, limit)).await?,
    };
    let changes = batch.changes.into_iter().map(change_entry).collect();
    let page = ChangePage {
        changes,
        next: batch.next.to_string(),
        head,
    };
    let mut response = reply::json(StatusCode::OK, &page);
    if saved.is_some() && replica.is_some() {
        let headers = response.headers_mut();
        headers.insert(h::SAVED_TAKEN, http::HeaderValue::from_static("1"));
    }
    Ok(response)
}

/// A peer replica's pull: refused if it asks from before a tombstone this replica dropped (its
/// own cursor went back, or it was not a replica when the drop happened: it may hold data that
/// delete removed, so it must be rebuilt); otherwise its saved position (where its restart
/// would resume; `after` when it does not say) feeds the horizon.
///
/// Except for a `fresh` copy: a replica its node is rebuilding from an empty store (`fresh=1`),
/// or any export (a bulk copy into an empty store). Its data is what this feed and its peers'
/// copies hold now, taken after the drops: a tombstone is dropped only once every replica whose
/// position this replica knew had it, and only after every put it shadowed is gone from this
/// log (`FORMAT.md`, "Dropping tombstones"). So nothing it copies or pulls is a put whose
/// tombstone it missed, and its position below `dropped` is its first scan of this feed, not a
/// position that went back. Refusing it made a rebuilt replica whose first page ended below
/// `dropped` rebuild itself again, forever (the nemesis, seed 1: a replace-node move whose new
/// replica was refused, rebuilt and refused again never finished).
pub(crate) fn note_peer(
    node: &StorageNode,
    partition: u32,
    store: &Store,
    (peer, fresh): (&str, bool),
    (after, saved): (Cursor, Cursor),
) -> Result<()> {
    let dropped = store.dropped_through();
    if !fresh && after.incarnation == store.incarnation() && after.sequence < dropped {
        tracing::error!(partition, peer, after = %after, dropped,
            "a peer replica is behind tombstones this replica dropped: it must be rebuilt");
        // Its position is that low now: no tombstone after it is dropped.
        node.horizons
            .pulled(partition, peer, saved, store.incarnation());
        return Err(Error::BehindDroppedTombstones {
            partition,
            after: after.sequence,
            dropped,
        });
    }
    node.horizons
        .pulled(partition, peer, saved, store.incarnation());
    Ok(())
}

/// A peer's saved position, never past where it pulls from.
fn position(saved: Cursor, after: Cursor) -> Cursor {
    match saved.incarnation == after.incarnation && saved.sequence > after.sequence {
        true => after,
        false => saved,
    }
}

struct Query<'a> {
    after: Cursor,
    /// Where the pulling replica's restart would resume (its last saved cursor): everything
    /// before it is durably there. Its pulls between saves start further on (`after`).
    saved: Option<Cursor>,
    limit: usize,
    /// The node id of the peer replica pulling (replication names itself; other readers
    /// don't).
    replica: Option<&'a str>,
    /// The pulling replica is one its node is rebuilding from an empty store (`fresh=1`; see
    /// `note_peer`).
    fresh: bool,
}

fn parse_query(query: &str) -> Result<Query<'_>> {
    let mut after = Cursor::START;
    let mut saved = None;
    let mut limit = DEFAULT_LIMIT;
    let mut replica = None;
    let mut fresh = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => {
                after = value
                    .parse()
                    .map_err(|_| Error::BadQuery("after is not a cursor"))?
            }
            "saved" => {
                saved = Some(
                    value
                        .parse()
                        .map_err(|_| Error::BadQuery("saved is not a cursor"))?,
                )
            }
            "limit" => {
                let asked: usize = value
                    .parse()
                    .map_err(|_| Error::BadQuery("limit is not a number"))?;
                limit = asked.clamp(1, MAX_LIMIT);
            }
            "replica" => replica = Some(value),
            "fresh" => fresh = value == "1",
            _ => {}
        }
    }
    Ok(Query {
        after,
        saved,
        limit,
        replica,
        fresh,
    })
}

fn change_entry(change: larder_store::Change) -> ChangeEntry {
    let op = match change.op {
        Op::PutBlob => "put-blob",
        Op::DeleteBlob => "delete-blob",
        Op::PutDoc => "put-doc",
        Op::RemoveDoc => "remove-doc",
    };
    ChangeEntry {
        cursor: change.cursor.to_string(),
        op: op.into(),
        key: String::from_utf8_lossy(&change.key).into_owned(),
        time_ms: change.time_ms,
        version: change.version,
        size: change.size,
        expires_ms: change.expires_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(incarnation: u64, sequence: u64) -> Cursor {
        Cursor {
            incarnation,
            sequence,
        }
    }

    #[test]
    fn a_pull_names_where_it_reads_from_and_what_it_saved() {
        let q =
            parse_query("after=000000000000000a.9&saved=000000000000000a.4&replica=s2").unwrap();
        assert_eq!(q.after, cursor(10, 9));
        assert_eq!(q.saved, Some(cursor(10, 4)));
        assert_eq!(q.replica, Some("s2"));
        assert!(parse_query("after=000000000000000a.9")
            .unwrap()
            .saved
            .is_none());
        assert!(parse_query("saved=nonsense").is_err());
    }

    #[test]
    fn a_saved_position_never_counts_past_the_pull() {
        // Behind the pull: that is the position.
        assert_eq!(position(cursor(10, 4), cursor(10, 9)), cursor(10, 4));
        // Ahead of it, in the same feed: no further than the pull.
        assert_eq!(position(cursor(10, 12), cursor(10, 9)), cursor(10, 9));
        // Saved in another incarnation of this replica: it counts as nothing (`Horizons`).
        assert_eq!(position(cursor(7, 12), cursor(10, 9)), cursor(7, 12));
    }
}
