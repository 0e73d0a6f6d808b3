//! How a storage node encodes blob properties into the store's opaque `props` bytes.
//! Versioned JSON: `{"v":1,"p":{...}}`; an unknown version is reported, never guessed at.

use bytes::Bytes;
use larder_proto::BlobProperties;
use serde::{Deserialize, Serialize};

use crate::error::Error;

const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Stored {
    v: u32,
    p: BlobProperties,
}

pub fn encode(props: &BlobProperties) -> Bytes {
    let stored = Stored {
        v: VERSION,
        p: props.clone(),
    };
    Bytes::from(serde_json::to_vec(&stored).expect("properties always serialise"))
}

pub fn decode(bytes: &[u8]) -> Result<BlobProperties, Error> {
    let stored: Stored =
        serde_json::from_slice(bytes).map_err(|e| Error::CorruptProperties(e.to_string()))?;
    if stored.v != VERSION {
        return Err(Error::CorruptProperties(format!(
            "version {} is not supported",
            stored.v
        )));
    }
    Ok(stored.p)
}
