//! Larder's own S3 parsers (larder-s3): stored bucket index, upload list, key ring and upload
//! records; continuation tokens; CompleteMultipartUpload part lists. See
//! `larder_s3::fuzzing` for the property each keeps.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    larder_s3::fuzzing::exercise(data);
});
