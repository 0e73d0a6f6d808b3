//! Entry points for the fuzz target `s3_parsers` (`fuzz/`): Larder's own parsers of bytes that
//! come from disk or clients, with the properties each must keep on any input. Not an API.

use std::collections::BTreeMap;

use s3s::dto::{CompletedPart, ETag};

use crate::list::{self, After};
use crate::multipart;
use crate::records::{
    BucketIndex, Catalog, KeyRing, Leaf, LeafBaseBlob, Record, Upload, UploadList, UploadedPart,
    FORMAT,
};
use crate::upload_list::{self, Markers};

/// Runs every parser on `data`; panics if one panics or breaks its property.
pub fn exercise(data: &[u8]) {
    records(data);
    token(data);
    part_list(data);
}

/// Stored records: any bytes decode or fail; what decodes encodes back to itself, and a
/// decoded index or upload list pages without losing its first entry.
fn records(data: &[u8]) {
    if let Ok(index) = BucketIndex::decode(data) {
        assert_eq!(
            BucketIndex::decode(&index.encode()).ok().as_ref(),
            Some(&index)
        );
        let query = list::Query {
            prefix: "",
            delimiter: Some("/"),
            after: None,
            max_keys: 3,
        };
        let page = list::page(&index.objects, &query, None, 3);
        assert!(page.objects.len() + page.prefixes.len() <= 3);
    }
    if let Ok(leaf) = Leaf::decode(data) {
        assert_eq!(Leaf::decode(&leaf.encode()).ok().as_ref(), Some(&leaf));
    }
    if let Ok(base) = LeafBaseBlob::decode(data) {
        assert_eq!(
            LeafBaseBlob::decode(&base.encode()).ok().as_ref(),
            Some(&base)
        );
    }
    if let Ok(uploads) = UploadList::decode(data) {
        assert_eq!(
            UploadList::decode(&uploads.encode()).ok().as_ref(),
            Some(&uploads)
        );
        let none = Markers {
            key: None,
            id: None,
        };
        let page = upload_list::page(&uploads, "", Some("/"), &none, 3);
        assert!(page.uploads.len() + page.prefixes.len() <= 3);
    }
    let _ = Catalog::decode(data);
    let _ = KeyRing::decode(data);
    let _ = Upload::decode(data);
}

/// Continuation tokens from clients: parse or refuse; a parsed one makes the same token.
fn token(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(after) = After::parse(&text) {
        assert_eq!(After::parse(&after.token()).ok(), Some(after));
    }
}

/// A CompleteMultipartUpload part list (from the client's XML, as s3s parses it): each four
/// bytes a part number, the fifth's low bit whether its ETag is sent. Checked against an
/// upload of parts 1 to 4; an accepted list ascends strictly and names uploaded parts only.
fn part_list(data: &[u8]) {
    let mut upload = Upload {
        v: FORMAT,
        parts: BTreeMap::new(),
        ..Default::default()
    };
    for n in 1..=4u32 {
        let part = UploadedPart {
            blob: format!("b{n}"),
            size: if n == 4 { 1 } else { multipart::MIN_PART_SIZE },
            md5: format!("{n:032}"),
            modified_ms: 0,
            checksum: None,
        };
        upload.parts.insert(n, part);
    }
    let chosen: Vec<CompletedPart> = data
        .chunks(5)
        .filter(|c| c.len() == 5)
        .map(|c| {
            let number = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            CompletedPart {
                part_number: Some(number),
                e_tag: (c[4] & 1 == 1).then(|| ETag::Strong(format!("{number:032}"))),
                ..Default::default()
            }
        })
        .collect();
    if let Ok(selected) = multipart::select(&upload, &chosen) {
        assert!(selected.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(selected.iter().all(|(n, _)| upload.parts.contains_key(n)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_entry_point_takes_seeds_of_each_kind() {
        exercise(b"");
        exercise(br#"{"v":1,"created_ms":1,"objects":{"a/b":{"body":[],"size":0,"etag":"e","modified_ms":0}}}"#);
        exercise(br#"{"v":1,"uploads":{"k":{"id":1}}}"#);
        exercise(&After::Key("k".into()).token().into_bytes());
        exercise(&[1, 0, 0, 0, 1, 2, 0, 0, 0, 0]);
    }
}
