//! Visiting continuations: where a visit of one slice stopped, self-contained so that any
//! frontend (this one after a restart, or another) goes on from it.
//!
//! A slice is a range of the document order's hash `h` (see `larder_store::visit_hash`), and is
//! visited partition after partition, each in `(h, key)` order; a position is the partition
//! being visited and the last `(h, key)` returned from it. The token is the base64url (no
//! padding) of:
//!
//! ```text
//! version   u8   = 1
//! slices    u32  big-endian; the visit's slice count
//! slice_id  u32
//! partitions u32 the cluster's partition count when the token was made
//! partition u32  the partition being visited (< partitions)
//! has_after u8   0 or 1
//! [h u64, key_len u16, key (key_len bytes of UTF-8, at most MAX_KEY)]  when has_after = 1
//! ```
//!
//! Parsing is strict and bounded: at most [`MAX_TOKEN`] characters, exact length, every field
//! checked; a bad token is a 400.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Longest token accepted, in characters (a 1 KiB key encodes to about 1.4 KiB).
pub const MAX_TOKEN: usize = 2048;
/// Longest key a position may name: the store's key limit.
pub const MAX_KEY: usize = 1024;
const VERSION: u8 = 1;

/// Where a visit of one slice goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub slices: u32,
    pub slice_id: u32,
    pub partitions: u32,
    pub partition: u32,
    /// The last document returned from `partition`, or none yet.
    pub after: Option<(u64, String)>,
}

impl Position {
    pub fn encode(&self) -> String {
        let mut out = Vec::with_capacity(32);
        out.push(VERSION);
        for n in [self.slices, self.slice_id, self.partitions, self.partition] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        match &self.after {
            None => out.push(0),
            Some((h, key)) => {
                out.push(1);
                out.extend_from_slice(&h.to_be_bytes());
                let len = u16::try_from(key.len()).expect("keys are at most MAX_KEY bytes");
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(key.as_bytes());
            }
        }
        URL_SAFE_NO_PAD.encode(out)
    }

    pub fn decode(token: &str) -> Result<Position, String> {
        let bad = |why: &str| format!("bad continuation: {why}");
        if token.len() > MAX_TOKEN {
            return Err(bad("too long"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| bad("not base64url"))?;
        let mut rd = Reader(&bytes);
        if rd.take(1)? != [VERSION] {
            return Err(bad("unknown version"));
        }
        let (slices, slice_id, partitions, partition) =
            (rd.u32()?, rd.u32()?, rd.u32()?, rd.u32()?);
        if slices == 0 || slice_id >= slices || partitions == 0 || partition >= partitions {
            return Err(bad("inconsistent numbers"));
        }
        let after = match rd.take(1)? {
            [0] => None,
            [1] => {
                let h = u64::from_be_bytes(rd.take(8)?.try_into().expect("8 bytes"));
                let len = u16::from_be_bytes(rd.take(2)?.try_into().expect("2 bytes")) as usize;
                if len > MAX_KEY {
                    return Err(bad("key too long"));
                }
                let key = std::str::from_utf8(rd.take(len)?).map_err(|_| bad("key not UTF-8"))?;
                Some((h, key.to_owned()))
            }
            _ => return Err(bad("bad position tag")),
        };
        if !rd.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Position {
            slices,
            slice_id,
            partitions,
            partition,
            after,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("bad continuation: truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
}

/// The inclusive range of `h` slice `id` of `slices` covers: the hash space cut into `slices`
/// contiguous, nearly equal ranges.
pub fn slice_range(slices: u32, id: u32) -> (u64, u64) {
    let start = |i: u32| ((u128::from(i) << 64) / u128::from(slices)) as u64;
    let first = start(id);
    let last = if id + 1 >= slices {
        u64::MAX
    } else {
        start(id + 1) - 1
    };
    (first, last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn position() -> impl Strategy<Value = Position> {
        (
            1u32..100,
            any::<u32>(),
            1u32..1000,
            any::<u32>(),
            proptest::option::of((any::<u64>(), ".{0,40}")),
        )
            .prop_map(|(slices, id, partitions, p, after)| Position {
                slices,
                slice_id: id % slices,
                partitions,
                partition: p % partitions,
                after,
            })
    }

    proptest! {
        #[test]
        fn tokens_round_trip(position in position()) {
            prop_assert_eq!(Position::decode(&position.encode()), Ok(position));
        }

        #[test]
        fn any_text_decodes_or_fails_cleanly(text in ".{0,300}") {
            let _ = Position::decode(&text);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Position::decode(&URL_SAFE_NO_PAD.encode(bytes));
        }

        #[test]
        fn slices_cover_the_hash_space_without_overlap(slices in 1u32..5000) {
            let mut next = 0u64;
            for id in 0..slices {
                let (first, last) = slice_range(slices, id);
                prop_assert_eq!(first, next);
                prop_assert!(last >= first);
                if id + 1 == slices {
                    prop_assert_eq!(last, u64::MAX);
                } else {
                    next = last + 1;
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_did_not_make() {
        let ok = Position {
            slices: 4,
            slice_id: 1,
            partitions: 8,
            partition: 2,
            after: Some((7, "id:a:b::c".into())),
        };
        let token = ok.encode();
        assert!(Position::decode(&token[..token.len() - 2]).is_err());
        assert!(Position::decode(&format!("{token}AA")).is_err());
        assert!(Position::decode("!!").is_err());
        assert!(Position::decode(&"A".repeat(MAX_TOKEN + 1)).is_err());
        let bad = Position { slice_id: 4, ..ok };
        assert!(Position::decode(&bad.encode()).is_err());
    }
}
