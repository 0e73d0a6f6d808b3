//! Feeds arbitrary bytes to the decoder of the bulk bootstrap stream (a peer's answer to
//! `GET .../export`), in pieces of every size. It must never panic nor buffer past one frame
//! of the caps, and every frame it accepts must encode back to the same frame.
//!
//! Run: `cargo +nightly fuzz run export_frames` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let mut decoder = larder_proto::ExportDecoder::new(1 << 16);
    let mut wire = larder_proto::encode_stream_head(1).to_vec();
    wire.extend_from_slice(rest);
    for piece in wire.chunks(usize::from(step).max(1)) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let mut again = larder_proto::ExportDecoder::new(1 << 16);
                    again.push(&larder_proto::encode_stream_head(1));
                    again.push(&frame.encode());
                    assert_eq!(again.next_frame(), Ok(Some(frame)));
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(decoder.pending() <= 48 + 1024 + (1 << 20) + (1 << 16) + 4 + 256);
    }
});
