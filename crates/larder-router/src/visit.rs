//! Visiting one partition: a page of its documents in visiting order (`(h, key)`, see
//! `larder-proto`'s `visit.rs`) merged from `write_quorum` replicas.
//!
//! A replica may lack a write a quorum acknowledged, so no single replica's page is the truth.
//! Each replica returns its documents *and tombstones* in the same order; the merge keeps, per
//! key, the newest version among the replicas (a newer remove beats an older put), and emits
//! keys only up to the smallest "last key" among the replicas whose page was cut short: past
//! that key, a replica with a full page has not said what it holds, so a key there could still
//! have a newer version (or tombstone) on it. The next page starts after that bound, so every
//! key of the range is decided exactly once, by a quorum, whatever writes go on meanwhile.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::PartitionId;
use larder_proto::{ItemState, VisitItem, VisitPage, VisitQuery};
use tokio::time::Instant;

use crate::documents::{recv_by, DocError, DocRouter};
use crate::router::{refusal_message, refuses_the_request};

/// Largest page body read from a replica: the node's page budget (4 MiB of fields) plus one
/// document of the largest record size (16 MiB) plus the framing of a full page.
const MAX_PAGE_BODY: usize = (4 << 20) + (16 << 20) + larder_proto::VISIT_MAX_LIMIT * 8 * 1024;

/// A live document a visit returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisitedDoc {
    pub h: u64,
    pub id: String,
    pub version: u64,
    /// The stored fields: a JSON object.
    pub fields: Bytes,
}

/// What one page of a partition's range holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionPage {
    /// Live documents, in visiting order.
    pub docs: Vec<VisitedDoc>,
    /// Where the next page starts (after this position), or `None`: the range is done.
    pub next: Option<(u64, String)>,
}

/// Which documents of a partition a page covers.
#[derive(Clone, Debug)]
pub struct PageRequest {
    pub partition: PartitionId,
    /// The first and last `h` (inclusive) of the slice.
    pub first: u64,
    pub last: u64,
    /// Only documents after this position.
    pub after: Option<(u64, String)>,
    /// Most entries (live or not) per replica.
    pub limit: usize,
    /// A document selection the replicas evaluate (`larder-select`); what it does not match
    /// is left out of the page (after the merge, so a newer unmatched version still wins).
    pub selection: Option<String>,
}

impl DocRouter {
    /// The number of partitions documents are placed on.
    pub fn partition_count(&self) -> u32 {
        self.router.map().partitions.len() as u32
    }

    /// One merged page of `request.partition`'s documents (see the module docs).
    pub async fn visit_page(
        &self,
        request: &PageRequest,
        deadline: Instant,
    ) -> Result<PartitionPage, DocError> {
        let partition = request.partition;
        if partition >= self.partition_count() {
            return Err(DocError::Rejected(format!("no partition {partition}")));
        }
        let replicas = self.local_replicas(partition);
        let quorum = self.quorum(replicas.len());
        let path = VisitQuery {
            first: request.first,
            last: request.last,
            after: request.after.clone(),
            limit: request.limit.clamp(1, larder_proto::VISIT_MAX_LIMIT),
            selection: request.selection.clone(),
        }
        .path(partition);
        let mut answers = self.fan_out(&replicas, deadline, |_| {
            Request::get(path.clone())
                .body(larder_pool::empty())
                .expect("valid request")
        });
        let (mut pages, mut failures) = (Vec::new(), Vec::new());
        while let Some((node, answer)) = recv_by(&mut answers, deadline).await? {
            match read_page(answer, deadline).await {
                Ok(page) => pages.push(page),
                Err(PageFailure::Refused(message)) => {
                    return Err(DocError::Rejected(format!("{node}: {message}")))
                }
                Err(PageFailure::Failed(err)) => failures.push(format!("{node}: {err}")),
            }
            if pages.len() >= quorum {
                break;
            }
            if failures.len() > replicas.len() - quorum {
                if Instant::now() >= deadline {
                    return Err(DocError::Timeout);
                }
                return Err(DocError::Unavailable(format!(
                    "visiting partition {partition}: {} of {quorum} replicas answered ({})",
                    pages.len(),
                    failures.join("; ")
                )));
            }
        }
        if pages.len() < quorum {
            return Err(DocError::Unavailable("too few replicas answered".into()));
        }
        merge(pages)
            .map_err(|e| DocError::Unavailable(format!("visiting partition {partition}: {e}")))
    }
}

enum PageFailure {
    Refused(String),
    Failed(String),
}

async fn read_page(
    answer: Result<http::Response<hyper::body::Incoming>, String>,
    deadline: Instant,
) -> Result<VisitPage, PageFailure> {
    let response = answer.map_err(PageFailure::Failed)?;
    match response.status() {
        StatusCode::OK => {}
        status if refuses_the_request(status) => {
            return Err(PageFailure::Refused(
                refusal_message(response, deadline).await,
            ))
        }
        other => return Err(PageFailure::Failed(format!("status {other}"))),
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_PAGE_BODY).collect();
    let body = tokio::time::timeout_at(deadline, body)
        .await
        .map_err(|_| PageFailure::Failed("page body timed out".into()))?
        .map_err(|e| PageFailure::Failed(format!("reading the page: {e}")))?
        .to_bytes();
    VisitPage::decode(&body).map_err(|e| PageFailure::Failed(e.to_string()))
}

/// Merges replicas' pages of the same range (see the module docs).
pub(crate) fn merge(pages: Vec<VisitPage>) -> Result<PartitionPage, &'static str> {
    let mut bound: Option<(u64, &str)> = None;
    for page in pages.iter().filter(|p| p.more) {
        let last = page
            .items
            .last()
            .ok_or("a replica's page was cut but empty")?;
        let pos = (last.h, last.key.as_str());
        if bound.is_none_or(|b| pos < b) {
            bound = Some(pos);
        }
    }
    let next = bound.map(|(h, key)| (h, key.to_owned()));
    let mut newest: BTreeMap<(u64, String), VisitItem> = BTreeMap::new();
    for item in pages.into_iter().flat_map(|p| p.items) {
        if next
            .as_ref()
            .is_some_and(|(h, k)| (item.h, item.key.as_str()) > (*h, k.as_str()))
        {
            continue;
        }
        match newest.get(&(item.h, item.key.clone())) {
            Some(held) if held.version >= item.version => {}
            _ => {
                newest.insert((item.h, item.key.clone()), item);
            }
        }
    }
    let docs = newest
        .into_values()
        .filter_map(|item| match item.state {
            ItemState::Live(fields) => Some(VisitedDoc {
                h: item.h,
                id: item.key,
                version: item.version,
                fields,
            }),
            ItemState::Removed | ItemState::Unmatched => None,
        })
        .collect();
    Ok(PartitionPage { docs, next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item(h: u64, key: &str, version: u64, live: bool) -> VisitItem {
        VisitItem {
            h,
            key: key.into(),
            version,
            time_ms: 0,
            state: if live {
                ItemState::Live(Bytes::from_static(b"{}"))
            } else {
                ItemState::Removed
            },
        }
    }

    #[test]
    fn newest_wins_and_a_cut_page_bounds_the_merge() {
        let a = VisitPage {
            more: true,
            items: vec![item(1, "a", 5, true), item(2, "b", 5, true)],
        };
        let b = VisitPage {
            more: false,
            items: vec![
                item(1, "a", 6, false),
                item(2, "b", 4, true),
                item(3, "c", 1, true),
            ],
        };
        let merged = merge(vec![a, b]).unwrap();
        // "a" was removed later; "c" lies past the cut replica's last key: next page.
        assert_eq!(merged.docs.len(), 1);
        assert_eq!(
            (merged.docs[0].id.as_str(), merged.docs[0].version),
            ("b", 5)
        );
        assert_eq!(merged.next, Some((2, "b".into())));
    }

    /// A model: two replicas each holding a subset of versions of some keys. Visiting with any
    /// page size returns, once each, exactly the keys whose newest version is live.
    /// Odd versions are puts, even ones removes: replicas holding one version agree on it.
    fn replica_state() -> impl Strategy<Value = BTreeMap<u8, (u64, bool)>> {
        proptest::collection::btree_map(any::<u8>(), (1u64..6).prop_map(|v| (v, v % 2 == 1)), 0..40)
    }

    proptest! {
        #[test]
        fn paging_through_merged_replicas_returns_each_live_key_once(
            a in replica_state(), b in replica_state(), limit in 1usize..8
        ) {
            let page_of = |rep: &BTreeMap<u8, (u64, bool)>, after: &Option<(u64, String)>| {
                let all: Vec<VisitItem> = rep
                    .iter()
                    .map(|(k, (v, live))| item(u64::from(*k / 16), &format!("{k:03}"), *v, *live))
                    .filter(|i| after.as_ref().is_none_or(|(h, k)| (i.h, i.key.as_str()) > (*h, k.as_str())))
                    .collect();
                VisitPage { more: all.len() > limit, items: all.into_iter().take(limit).collect() }
            };
            let mut after = None;
            let mut seen = Vec::new();
            for _ in 0..1000 {
                let merged = merge(vec![page_of(&a, &after), page_of(&b, &after)]).unwrap();
                seen.extend(merged.docs.into_iter().map(|d| d.id));
                after = merged.next;
                if after.is_none() { break; }
            }
            let mut expected = Vec::new();
            for k in a.keys().chain(b.keys()).collect::<std::collections::BTreeSet<_>>() {
                let newest = [a.get(k), b.get(k)].into_iter().flatten().max_by_key(|(v, _)| *v);
                if newest.is_some_and(|(_, live)| *live) { expected.push(format!("{k:03}")); }
            }
            let mut sorted = seen.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), seen.len());
            prop_assert_eq!(sorted, expected);
        }
    }
}
