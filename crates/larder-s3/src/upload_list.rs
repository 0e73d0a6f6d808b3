//! ListMultipartUploads: a bucket's uploads in progress, listed from one record
//! (`larder-s3:uploads:<bucket>`) changed at its partition primary when an upload starts and
//! when it is completed or aborted. Pages by name, then upload ID, with prefix, delimiter and
//! the key and upload-ID markers; the work is a range scan bounded by the page size.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::error::S3Error;
use crate::records::{uploads_doc, UploadList, FORMAT, MAX_INDEX_ENTRIES};
use crate::service::Larder;
use crate::store::Change;

/// One listed upload: name, upload ID, creation time (ms).
pub type Listed<'a> = (&'a str, &'a str, u64);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct UploadPage<'a> {
    pub uploads: Vec<Listed<'a>>,
    pub prefixes: Vec<String>,
    /// The markers of the next page (key, upload ID; the ID empty after a common prefix),
    /// when this one was cut at its size.
    pub next: Option<(String, String)>,
}

/// Where a page starts: after `key_marker` (with `id_marker`: after that upload of that name).
pub struct Markers<'a> {
    pub key: Option<&'a str>,
    pub id: Option<&'a str>,
}

/// The page of `list` under `prefix` after `markers`, at most `max` entries (uploads and
/// common prefixes together).
pub fn page<'a>(
    list: &'a UploadList,
    prefix: &str,
    delimiter: Option<&str>,
    markers: &Markers<'_>,
    max: usize,
) -> UploadPage<'a> {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let start = match markers.key {
        Some(k) if k >= prefix => Bound::Included(k),
        _ => Bound::Included(prefix),
    };
    // A key marker without an upload-ID marker that is a common prefix (it ends with the
    // delimiter, below `prefix`) resumes after every name under it.
    let skip_prefix = markers.key.filter(|k| {
        markers.id.is_none()
            && k.len() > prefix.len()
            && k.starts_with(prefix)
            && delimiter.is_some_and(|d| k.ends_with(d))
    });
    let mut page = UploadPage::default();
    for (key, ids) in list.uploads.range::<str, _>((start, Bound::Unbounded)) {
        if !key.starts_with(prefix) {
            break;
        }
        if skip_prefix.is_some_and(|p| key.starts_with(p)) {
            continue;
        }
        let at_marker = markers.key == Some(key.as_str());
        let folded = delimiter.and_then(|d| {
            let rest = &key[prefix.len()..];
            rest.find(d)
                .map(|at| key[..prefix.len() + at + d.len()].to_owned())
        });
        if let Some(common) = folded {
            if at_marker || page.prefixes.last() == Some(&common) {
                continue;
            }
            if full(&page, max) {
                page.next = Some(last_markers(&page));
                return page;
            }
            page.prefixes.push(common);
            continue;
        }
        let after_id = match (at_marker, markers.id) {
            (true, Some(id)) => Bound::Excluded(id),
            // Without an upload-ID marker, a key marker skips that name's uploads.
            (true, None) => continue,
            (false, _) => Bound::Unbounded,
        };
        for (id, created) in ids.range::<str, _>((after_id, Bound::Unbounded)) {
            if full(&page, max) {
                page.next = Some(last_markers(&page));
                return page;
            }
            page.uploads.push((key.as_str(), id.as_str(), *created));
        }
    }
    page
}

fn full(page: &UploadPage<'_>, max: usize) -> bool {
    page.uploads.len() + page.prefixes.len() >= max
}

/// The markers after the last entry of a full page (the greater of its last upload and its
/// last common prefix, which is where the listing stopped).
fn last_markers(page: &UploadPage<'_>) -> (String, String) {
    let upload = page.uploads.last();
    let prefix = page.prefixes.last();
    match (upload, prefix) {
        (Some((key, _, _)), Some(p)) if p.as_str() > *key => (p.clone(), String::new()),
        (Some((key, id, _)), _) => ((*key).to_owned(), (*id).to_owned()),
        (None, Some(p)) => (p.clone(), String::new()),
        (None, None) => (String::new(), String::new()),
    }
}

/// Lists upload `id` of `key`; refused past the bound one record holds.
pub async fn add(
    s3: &Larder,
    bucket: &str,
    key: &str,
    id: &str,
    created_ms: u64,
) -> Result<(), S3Error> {
    s3.records
        .update(&uploads_doc(bucket), |list: Option<UploadList>| {
            let mut list = list.unwrap_or(UploadList {
                v: FORMAT,
                uploads: BTreeMap::new(),
            });
            if list.len() >= MAX_INDEX_ENTRIES {
                return Err(S3Error::IndexFull(format!(
                    "bucket {bucket} has {MAX_INDEX_ENTRIES} multipart uploads in progress; \
                     complete or abort some"
                )));
            }
            list.uploads
                .entry(key.to_owned())
                .or_default()
                .insert(id.to_owned(), created_ms);
            Ok((Change::Put(list), ()))
        })
        .await
}

/// Unlists upload `id` of `key` (nothing to do if it is not listed).
pub async fn remove(s3: &Larder, bucket: &str, key: &str, id: &str) -> Result<(), S3Error> {
    s3.records
        .update(&uploads_doc(bucket), |list: Option<UploadList>| {
            let Some(mut list) = list else {
                return Ok((Change::Keep, ()));
            };
            let Some(ids) = list.uploads.get_mut(key) else {
                return Ok((Change::Keep, ()));
            };
            if ids.remove(id).is_none() {
                return Ok((Change::Keep, ()));
            }
            if ids.is_empty() {
                list.uploads.remove(key);
            }
            match list.uploads.is_empty() {
                true => Ok((Change::Remove, ())),
                false => Ok((Change::Put(list), ())),
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(entries: &[(&str, &str)]) -> UploadList {
        let mut list = UploadList {
            v: FORMAT,
            uploads: BTreeMap::new(),
        };
        for (key, id) in entries {
            list.uploads
                .entry(key.to_string())
                .or_default()
                .insert(id.to_string(), 0);
        }
        list
    }

    /// Everything listed, following the markers, with pages of `max`.
    fn all(list: &UploadList, prefix: &str, delimiter: Option<&str>, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        loop {
            let m = Markers {
                key: markers.as_ref().map(|(k, _)| k.as_str()),
                id: markers
                    .as_ref()
                    .map(|(_, i)| i.as_str())
                    .filter(|i| !i.is_empty()),
            };
            let page = page(list, prefix, delimiter, &m, max);
            let mut items: Vec<String> = page
                .uploads
                .iter()
                .map(|(k, i, _)| format!("{k} {i}"))
                .collect();
            items.extend(page.prefixes.iter().cloned());
            items.sort();
            out.extend(items);
            match page.next {
                Some(next) => markers = Some(next),
                None => return out,
            }
        }
    }

    #[test]
    fn uploads_list_by_name_then_id_and_fold_under_a_delimiter() {
        let uploads = list(&[
            ("a/1", "x"),
            ("a/2", "y"),
            ("b", "p"),
            ("b", "q"),
            ("c", "z"),
        ]);
        let page = page(
            &uploads,
            "",
            Some("/"),
            &Markers {
                key: None,
                id: None,
            },
            2,
        );
        assert_eq!(page.prefixes, ["a/"]);
        assert_eq!(page.uploads, [("b", "p", 0)]);
        assert_eq!(page.next, Some(("b".into(), "p".into())));
        let markers = Markers {
            key: Some("b"),
            id: Some("p"),
        };
        let rest = super::page(&uploads, "", Some("/"), &markers, 10);
        assert_eq!(rest.uploads, [("b", "q", 0), ("c", "z", 0)]);
        assert_eq!(rest.next, None);
    }

    proptest! {
        // Paging never loses or repeats an upload or prefix, whatever the page size.
        #[test]
        fn pages_add_up_to_the_whole_listing(
            entries in proptest::collection::vec(("[ab/]{1,5}", "[xyz]"), 0..30),
            prefix in "[ab/]{0,2}",
            slash in any::<bool>(),
            max in 1usize..5,
        ) {
            let entries: Vec<(&str, &str)> =
                entries.iter().map(|(k, i)| (k.as_str(), i.as_str())).collect();
            let uploads = list(&entries);
            let delimiter = slash.then_some("/");
            prop_assert_eq!(
                all(&uploads, &prefix, delimiter, max),
                all(&uploads, &prefix, delimiter, usize::MAX)
            );
        }
    }
}
