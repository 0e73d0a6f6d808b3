//! One listing page walked across a bucket's index leaves in key order. `index_tree.rs` reads
//! the leaves; this decides what each adds to the page and where the page ends, apart from the
//! reads, so that it is tested over leaves in memory (the property test below).
//!
//! A page reads at most `MAX_LEAVES_PER_PAGE` leaves past its first before it ends early,
//! truncated: a run of leaves emptied by deletes, until they are merged (`index_tree/merge.rs`,
//! which the write that empties a leaf starts, and a listing that walks one), would otherwise
//! be walked to its end in one request. Where the next page starts must then be said:
//!
//! - ListObjectsV2's continuation token is ours, so it names a place: "at `high`".
//! - ListObjects v1 and ListObjectVersions resume from a marker, which is a name: "after
//!   `m`", and a marker that is a common prefix means "after every name under it". The page
//!   ends at a leaf `[low, high)` with a name `m` such that no name between `m` and `high` is
//!   still to be listed: `low` itself (nothing in that leaf was listed or it would be past
//!   `low`), or the last thing listed if that is further. A `low` that reads as a common
//!   prefix (`photos/` with the delimiter `/`) would skip the names under it after `high`, so
//!   the name just before it is used instead (`photos`), and only if it still lies past the
//!   page's first leaf (so every page moves on by a leaf at least); if not, the walk goes on
//!   to the next leaf and tries again. That can happen only for the leaves whose `low` is a
//!   common prefix extending a prefix of the first leaf's end: a few at most, ~1 KiB of them
//!   in a contrived bucket.

use crate::list::{self, After, Page, Query};
use crate::records::Objects;

/// How a page cut short by a run of leaves says where the next one starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// A continuation token, which can name a place (`After::At`).
    Token,
    /// A marker, which is a name (see the module's comment).
    Name,
}

/// What the walk does after a leaf.
#[derive(Debug)]
pub enum Step {
    /// The page is complete.
    Done(Page),
    /// Read the leaf to the right and `visit` it.
    Next,
    /// More leaves than any bucket has in a row: a cycle of links, reported as corruption.
    TooManyLeaves,
}

/// A page being put together, leaf after leaf.
pub struct Pager<'q> {
    query: &'q Query<'q>,
    /// What the page listed last (at first: where the query starts after).
    after: Option<After>,
    out: Page,
    /// Leaves passed so far.
    hops: usize,
    /// After how many leaves past the first the page ends early, and how it resumes then.
    limit: Option<(usize, Resume)>,
    /// The end of the page's first leaf: a page that ends early resumes past it.
    first_high: Option<String>,
    max_leaves: usize,
}

impl<'q> Pager<'q> {
    pub fn new(query: &'q Query<'q>, limit: Option<(usize, Resume)>, max_leaves: usize) -> Self {
        Pager {
            query,
            after: query.after.cloned(),
            out: Page::default(),
            hops: 0,
            limit,
            first_high: None,
            max_leaves,
        }
    }

    /// Takes the names of the next leaf in key order, which covers `[low, high)` (`high`
    /// `None`: to the end of the bucket).
    pub fn visit(&mut self, objects: &Objects, low: &str, high: Option<&str>) -> Step {
        let query = self.query;
        let remaining = query.max_keys - self.out.len();
        let sub = list::page(objects, query, self.after.as_ref(), remaining);
        if let Some(last) = sub.last() {
            self.after = Some(last);
        }
        let (cut, next) = (sub.cut, sub.next.clone());
        self.out.append(sub);
        if cut {
            self.out.cut = true;
            self.out.next = next.or_else(|| self.out.last());
            return Step::Done(self.take());
        }
        let Some(high) = high else {
            return Step::Done(self.take());
        };
        if !high.starts_with(query.prefix) && high > query.prefix {
            return Step::Done(self.take()); // past the prefix's names
        }
        self.first_high.get_or_insert_with(|| high.to_owned());
        self.hops += 1;
        if self.hops > self.max_leaves {
            return Step::TooManyLeaves;
        }
        if let Some((_, resume)) = self.limit.filter(|(limit, _)| self.hops > *limit) {
            // Without a marker that moves on (see the module's comment), one more leaf.
            if let Some(next) = self.resume(low, high, resume) {
                self.out.cut = true;
                self.out.next = Some(next);
                return Step::Done(self.take());
            }
        }
        Step::Next
    }

    fn take(&mut self) -> Page {
        std::mem::take(&mut self.out)
    }

    /// Where the next page starts if this one ends after the leaf `[low, high)`; `None` if
    /// no marker would move on (go on to the next leaf).
    fn resume(&self, low: &str, high: &str, resume: Resume) -> Option<After> {
        // Inside a common prefix already listed: resume after all of it.
        if let Some(After::Prefix(p)) = &self.after {
            let inside = |name: &str| name.starts_with(p.as_str());
            if inside(high) || (resume == Resume::Name && inside(low)) {
                return Some(After::Prefix(p.clone()));
            }
        }
        if resume == Resume::Token {
            return Some(After::At(high.to_owned()));
        }
        let low_name = match list::common_prefix_marker(low, self.query) {
            Some(delimiter) => &low[..low.len() - delimiter.len()],
            None => low,
        };
        let candidate = match &self.after {
            Some(after) if after.name() >= low_name => after.clone(),
            _ => After::Key(low_name.to_owned()),
        };
        let first_high = self.first_high.as_deref().unwrap_or(high);
        (candidate.name() >= first_high).then_some(candidate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A bucket cut into leaves at `bounds` (each a leaf's `low`; the first leaf's is "").
    struct Leaves(Vec<(String, Objects)>);

    impl Leaves {
        fn new(names: &[String], bounds: &[String]) -> Leaves {
            let mut lows: Vec<String> = std::iter::once(String::new())
                .chain(bounds.iter().cloned())
                .collect();
            lows.sort();
            lows.dedup();
            let leaves = lows
                .iter()
                .enumerate()
                .map(|(i, low)| {
                    let high = lows.get(i + 1);
                    let objects = names
                        .iter()
                        .filter(|n| n.as_str() >= low.as_str() && high.is_none_or(|h| *n < h))
                        .map(|n| {
                            (
                                n.clone(),
                                std::sync::Arc::<crate::records::ObjectEntry>::default(),
                            )
                        })
                        .collect();
                    (low.clone(), objects)
                })
                .collect();
            Leaves(leaves)
        }

        /// One page, walked as `IndexTree::page` walks it; also how many leaves it read.
        fn page(&self, query: &Query<'_>, limit: (usize, Resume)) -> (Page, usize) {
            let start = query.start_key();
            let mut at = self.0.iter().rposition(|(low, _)| *low <= start).unwrap();
            let mut pager = Pager::new(query, Some(limit), 1 << 20);
            let mut read = 0;
            loop {
                read += 1;
                let high = self.0.get(at + 1).map(|(low, _)| low.as_str());
                match pager.visit(&self.0[at].1, &self.0[at].0, high) {
                    Step::Done(page) => return (page, read),
                    Step::Next => at += 1,
                    Step::TooManyLeaves => panic!("a cycle in a list of leaves"),
                }
            }
        }
    }

    /// Every entry of a listing, page after page, resuming as the clients of `resume` do:
    /// v2 with the token, v1 with the marker (NextMarker, read back as v1 reads a marker).
    fn all(
        leaves: &Leaves,
        (prefix, delimiter): (&str, Option<&str>),
        max: usize,
        limit: (usize, Resume),
    ) -> (Vec<String>, usize) {
        let (mut out, mut pages) = (Vec::new(), 0);
        let mut after: Option<After> = None;
        loop {
            pages += 1;
            assert!(pages < 10_000, "a listing that does not end");
            let query = Query {
                prefix,
                delimiter,
                after: after.as_ref(),
                max_keys: max,
            };
            let (page, read) = leaves.page(&query, limit);
            assert!(
                read <= limit.0.saturating_add(65),
                "a page read {read} leaves"
            );
            let mut items: Vec<String> = page.objects.iter().map(|(k, _)| k.clone()).collect();
            items.extend(page.prefixes.iter().cloned());
            items.sort();
            out.extend(items);
            let Some(next) = page.next else {
                return (out, pages);
            };
            after = Some(match limit.1 {
                Resume::Token => After::parse(&next.token()).unwrap(),
                Resume::Name => list::marker(next.name(), prefix, delimiter),
            });
        }
    }

    #[test]
    fn a_common_prefix_over_many_leaves_is_passed_in_one_step() {
        // "a/" spans 30 leaves; with 4 leaves a page, a listing with "/" used to start every
        // page at "a/" again and never end.
        let names: Vec<String> = (0..30)
            .map(|i| format!("a/{i:02}"))
            .chain(["b".into()])
            .collect();
        let bounds: Vec<String> = names.clone();
        let leaves = Leaves::new(&names, &bounds);
        for resume in [Resume::Token, Resume::Name] {
            let (got, _) = all(&leaves, ("", Some("/")), 1000, (4, resume));
            assert_eq!(got, ["a/", "b"], "{resume:?}");
        }
    }

    #[test]
    fn a_marker_is_never_read_as_a_common_prefix_when_it_is_a_key() {
        // "p/" is a key of the prefix "p/" (nothing after the prefix to fold).
        let names: Vec<String> = ["p/", "p/a", "p/b"].map(String::from).to_vec();
        let leaves = Leaves::new(&names, &[]);
        let (got, _) = all(&leaves, ("p/", Some("/")), 1, (4, Resume::Name));
        assert_eq!(got, ["p/", "p/a", "p/b"]);
    }

    #[test]
    fn a_run_of_empty_leaves_costs_pages_not_one_long_walk() {
        // 2,000 empty leaves, then a name: each page reads at most the limit (+1).
        let bounds: Vec<String> = (0..2000).map(|i| format!("k{i:05}/")).collect();
        let names = vec!["z".to_string()];
        let leaves = Leaves::new(&names, &bounds);
        for resume in [Resume::Token, Resume::Name] {
            let (got, pages) = all(&leaves, ("", Some("/")), 1000, (64, resume));
            assert_eq!(got, ["z"]);
            assert!(pages > 2000 / 70, "{resume:?}: {pages} pages");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        // Whatever the leaves, page size and limit, the pages add up to the one-page listing
        // of the whole bucket, for tokens and for markers alike.
        #[test]
        fn pages_over_leaves_add_up_to_the_whole_listing(
            names in proptest::collection::btree_set("[ab./]{1,5}", 0..30),
            bounds in proptest::collection::vec("[ab./]{1,5}", 0..30),
            prefix in "[ab/]{0,2}",
            slash in any::<bool>(),
            max in 1usize..5,
            limit in 1usize..4,
            by_name in any::<bool>(),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let leaves = Leaves::new(&names, &bounds);
            let whole = Leaves::new(&names, &[]);
            let delimiter = slash.then_some("/");
            let resume = if by_name { Resume::Name } else { Resume::Token };
            let (expected, _) = all(&whole, (&prefix, delimiter), usize::MAX, (usize::MAX, resume));
            let (got, _) = all(&leaves, (&prefix, delimiter), max, (limit, resume));
            prop_assert_eq!(got, expected);
        }
    }
}
