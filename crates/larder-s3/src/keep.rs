//! Reading one name out of an index record without building all of it. A GET, HEAD or
//! CopyObject source needs one entry of a record that holds up to 1,000 (a quarter of a
//! megabyte of JSON); building every entry (strings, maps, allocations) took most of the S3
//! port's CPU per GET of 1 KiB. With `Keep::One`, the record's `objects` map is still parsed
//! (the JSON must be valid as a whole, and every other field is built as usual) but every
//! other entry is skipped over without being built.
//!
//! The choice reaches the `objects` field's deserializer through a thread-local, set for the
//! one synchronous `decode` call (`decode_keeping`) and reset by a guard, even on a panic. A
//! record decoded this way is incomplete: it is for reading only, never for writing back, so
//! only `Records::read_keeping` decodes it, and read-modify-writes always decode in full.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use crate::record_cache::Cacheable;
use crate::records::{BucketIndex, Garbage, Leaf, ObjectEntry, Objects};

/// What a decode keeps of an index record's entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Every entry (the default, and what every write starts from).
    All,
    /// Only the entry of this name, if the record holds it.
    One(String),
}

thread_local! {
    static KEEPING: RefCell<Keep> = const { RefCell::new(Keep::All) };
}

/// Runs `decode` with `keep` in force for the `objects` fields it deserializes.
pub fn decode_keeping<T>(keep: &Keep, decode: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            KEEPING.with(|k| *k.borrow_mut() = Keep::All);
        }
    }
    KEEPING.with(|k| *k.borrow_mut() = keep.clone());
    let _reset = Reset;
    decode()
}

/// The `objects` field's deserializer (`#[serde(deserialize_with)]`): every entry, or only
/// the one `decode_keeping` asks for.
pub fn objects<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Objects, D::Error> {
    let keep = KEEPING.with(|k| k.borrow().clone());
    match keep {
        Keep::All => deserializer.deserialize_map(AllEntries),
        Keep::One(name) => deserializer.deserialize_map(OneEntry { name }),
    }
}

/// The `garbage` field's deserializer: every entry, or none when only one name is kept (a
/// read of one name has no use for the blobs its record holds for the sweep; a name
/// overwritten often keeps thousands of them there).
pub fn garbage<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Garbage>, D::Error> {
    let keep = KEEPING.with(|k| k.borrow().clone());
    match keep {
        Keep::All => Vec::deserialize(deserializer),
        Keep::One(_) => IgnoredAny::deserialize(deserializer).map(|_| Vec::new()),
    }
}

/// Every entry, inserted as read (names come in order, as written).
struct AllEntries;

impl<'de> Visitor<'de> for AllEntries {
    type Value = Objects;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of names to object entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut all = Objects::new();
        while let Some((name, entry)) = map.next_entry::<String, Arc<ObjectEntry>>()? {
            all.insert(name, entry);
        }
        Ok(all)
    }
}

struct OneEntry {
    name: String,
}

impl<'de> Visitor<'de> for OneEntry {
    type Value = Objects;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of names to object entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Objects::new();
        while let Some(is_it) = map.next_key_seed(IsName(&self.name))? {
            if is_it {
                kept.insert(
                    self.name.clone(),
                    Arc::new(map.next_value::<ObjectEntry>()?),
                );
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(kept)
    }
}

/// A map key, compared with the name wanted without being copied (when it has no escapes).
struct IsName<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for IsName<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for IsName<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}

/// The entries `keep` keeps of `objects`, cloned.
pub(crate) fn kept_entries(objects: &Objects, keep: &Keep) -> Objects {
    match keep {
        Keep::All => objects.clone(),
        Keep::One(name) => objects
            .get_key_value(name)
            .map(|(k, v)| (k.clone(), v.clone()))
            .into_iter()
            .collect(),
    }
}

/// The garbage list as `keep` keeps it: whole, or none for a read of one name (as `garbage`).
fn kept_garbage(garbage: &[Garbage], keep: &Keep) -> Vec<Garbage> {
    match keep {
        Keep::All => garbage.to_vec(),
        Keep::One(_) => Vec::new(),
    }
}

// Every field is named (no `..self.clone()`), so the objects are never cloned whole for a
// read of one name, and a new field does not compile until it is decided here.
impl Cacheable for BucketIndex {
    fn keeping(&self, keep: &Keep) -> Self {
        BucketIndex {
            v: self.v,
            created_ms: self.created_ms,
            objects: kept_entries(&self.objects, keep),
            garbage: kept_garbage(&self.garbage, keep),
            public_read: self.public_read,
            tags: self.tags.clone(),
            leaves: self.leaves.clone(),
            splitting: self.splitting.clone(),
            deleting: self.deleting.clone(),
            base: self.base.clone(),
            removed: self.removed.clone(),
        }
    }
}

impl Cacheable for Leaf {
    fn keeping(&self, keep: &Keep) -> Self {
        Leaf {
            v: self.v,
            bucket_created_ms: self.bucket_created_ms,
            low: self.low.clone(),
            high: self.high.clone(),
            right: self.right.clone(),
            objects: kept_entries(&self.objects, keep),
            garbage: kept_garbage(&self.garbage, keep),
            splitting: self.splitting.clone(),
            sealed: self.sealed.clone(),
            merging: self.merging.clone(),
            base: self.base.clone(),
            removed: self.removed.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{BucketIndex, Leaf, Record};
    use proptest::prelude::*;

    fn entry(size: u64) -> ObjectEntry {
        ObjectEntry {
            size,
            etag: format!("e{size}"),
            ..Default::default()
        }
    }

    #[test]
    fn one_entry_is_kept_and_everything_else_is_as_in_full() {
        let mut leaf = Leaf {
            v: crate::records::FORMAT_SPLIT,
            low: "a".into(),
            high: Some("z".into()),
            ..Default::default()
        };
        for (i, name) in ["a", "b\"quoted\"", "c/é", "d"].iter().enumerate() {
            leaf.objects
                .insert((*name).into(), Arc::new(entry(i as u64)));
        }
        let bytes = leaf.encode();
        for name in ["b\"quoted\"", "c/é", "missing"] {
            let keep = Keep::One(name.into());
            let read: Leaf = decode_keeping(&keep, || Leaf::decode(&bytes)).unwrap();
            let mut want = leaf.clone();
            want.objects = want
                .objects
                .into_iter()
                .filter(|(k, _)| k == name)
                .collect();
            assert_eq!(read, want);
        }
        // Reset afterwards: the next decode is whole.
        assert_eq!(Leaf::decode(&bytes).unwrap(), leaf);
        let root = BucketIndex {
            v: crate::records::FORMAT,
            objects: leaf.objects.clone(),
            ..Default::default()
        };
        let keep = Keep::One("d".into());
        let read: BucketIndex =
            decode_keeping(&keep, || BucketIndex::decode(&root.encode())).unwrap();
        assert_eq!(read.objects.keys().collect::<Vec<_>>(), ["d"]);
    }

    /// Skipped entries are checked as JSON only (their fields are not looked at); the rest of
    /// the record is checked as in full.
    #[test]
    fn malformed_json_and_unknown_fields_are_refused_even_where_nothing_is_kept() {
        let keep = Keep::One("a".into());
        let bad = br#"{"v":2,"bucket_created_ms":0,"low":"","objects":{"b":[1,2}}"#;
        assert!(decode_keeping(&keep, || Leaf::decode(bad)).is_err());
        let unknown = br#"{"v":2,"bucket_created_ms":0,"low":"","objects":{},"x":1}"#;
        assert!(decode_keeping(&keep, || Leaf::decode(unknown)).is_err());
        let version = br#"{"v":9,"bucket_created_ms":0,"low":"","objects":{}}"#;
        assert!(decode_keeping(&keep, || Leaf::decode(version)).is_err());
        let wrong_entry = br#"{"v":2,"bucket_created_ms":0,"low":"","objects":{"a":{"size":"x"}}}"#;
        assert!(decode_keeping(&keep, || Leaf::decode(wrong_entry)).is_err());
    }

    proptest! {
        #[test]
        fn keeping_one_name_reads_what_a_full_decode_reads_for_it(
            names in proptest::collection::btree_set("[a-z\"\\\\/é]{0,6}", 0..20),
            wanted in "[a-z\"\\\\/é]{0,6}",
        ) {
            let mut leaf = Leaf { v: crate::records::FORMAT_SPLIT, ..Default::default() };
            for (i, name) in names.iter().enumerate() {
                leaf.objects.insert(name.clone(), Arc::new(entry(i as u64)));
            }
            let bytes = leaf.encode();
            let keep = Keep::One(wanted.clone());
            let read: Leaf = decode_keeping(&keep, || Leaf::decode(&bytes)).unwrap();
            prop_assert_eq!(read.objects.get(&wanted), leaf.objects.get(&wanted));
            prop_assert!(read.objects.len() <= 1);
        }
    }
}
