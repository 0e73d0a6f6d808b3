//! The fuzz target's property in normal CI: the record decoder never panics on random or
//! mutated bytes, accepts every record the encoder produced, and rejects every single-byte
//! change to one (the CRCs cover every byte of a record).

use larder_store::fuzzing::{decode_record_for_fuzz, encode_record_for_fuzz};
use proptest::prelude::*;

fn record() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 1..40),
        proptest::collection::vec(any::<u8>(), 0..40),
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec(any::<u8>(), 65_530..140_000)
        ],
        any::<u64>(),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(k, p, d, t, e)| encode_record_for_fuzz(&k, &p, &d, t, e))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        decode_record_for_fuzz(&bytes);
    }

    #[test]
    fn valid_records_decode_and_any_flip_is_rejected(rec in record(), at in any::<prop::sample::Index>(), x in 1..=255u8) {
        prop_assert!(decode_record_for_fuzz(&rec));
        let mut longer = rec.clone();
        longer.extend_from_slice(b"trailing bytes belong to the next record");
        prop_assert!(decode_record_for_fuzz(&longer));
        let mut bad = rec.clone();
        bad[at.index(rec.len())] ^= x;
        prop_assert!(!decode_record_for_fuzz(&bad));
    }

    #[test]
    fn truncated_or_spliced_records_never_panic(rec in record(), cut in any::<prop::sample::Index>(), junk in proptest::collection::vec(any::<u8>(), 0..64)) {
        let n = cut.index(rec.len());
        prop_assert!(!decode_record_for_fuzz(&rec[..n]));
        let mut spliced = rec[..n].to_vec();
        spliced.extend_from_slice(&junk);
        spliced.extend_from_slice(&rec[n..]);
        decode_record_for_fuzz(&spliced);
    }
}
