//! Batched small PUTs: many blobs for one storage node in one request (`PUT_BATCH_PATH`), and
//! one status per blob in its answer. A frontend sends a batch only while other PUTs to that node
//! are on the way (`larder-router`'s `put_batch.rs`), so that one HTTP/2 exchange carries what
//! would otherwise be dozens, each costing both sides more CPU than the bytes it carries.
//!
//! Request body: the version byte `1`, then items one after the other until the end:
//!
//! | bytes | field |
//! | ---: | --- |
//! | 4 | partition (big-endian) |
//! | 2 | key length, 1..=[`MAX_KEY`] |
//! | 4 | props length, at most [`MAX_PROPS`] (the `x-larder-props` value, `compact.rs`) |
//! | 4 | CRC32C of the data |
//! | 4 | data length, at most [`MAX_ITEM_DATA`] |
//! | … | key (UTF-8), props, data |
//!
//! At most [`MAX_ITEMS`] items and [`MAX_BODY`] bytes. Answer body (`200`): the version byte `1`,
//! then per item, in the request's order, its status (2 bytes) and a message (2 bytes of length,
//! at most [`MAX_MESSAGE`], then UTF-8): the status and error code a PUT of that blob alone
//! would have got. Decoding is one pass over the bytes, every length checked before it is used.

use bytes::{BufMut, Bytes, BytesMut};

/// Version byte that begins a batch and its answer.
const VERSION: u8 = 1;
/// Longest key of an item (a blob ID is far shorter).
pub const MAX_KEY: usize = 1024;
/// Largest properties value of an item: user metadata is at most 8 KiB.
pub const MAX_PROPS: usize = 64 * 1024;
/// Largest blob in a batch: batches are for small blobs.
pub const MAX_ITEM_DATA: usize = 1 << 20;
/// Most items in one batch.
pub const MAX_ITEMS: usize = 1024;
/// Largest batch body.
pub const MAX_BODY: usize = 8 << 20;
/// Longest message of one item's answer.
pub const MAX_MESSAGE: usize = 1024;

const ITEM_HEAD: usize = 4 + 2 + 4 + 4 + 4;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch is empty or not of version 1")]
    Version,
    #[error("batch is cut short in item {0}")]
    Truncated(usize),
    #[error("item {item}: {field} of {len} bytes is past its limit {max}")]
    TooLong {
        item: usize,
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("item {0}: key is empty or not UTF-8")]
    BadKey(usize),
    #[error("batch has more than {MAX_ITEMS} items or {MAX_BODY} bytes")]
    TooLarge,
    #[error("answer has {got} statuses for {expected} items")]
    Count { got: usize, expected: usize },
    #[error("answer's status {0} is not an HTTP status")]
    Status(u16),
    #[error("item {0}: a header name or value is not one")]
    BadHeader(usize),
}

/// One blob of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutItem {
    pub partition: u32,
    pub key: String,
    pub props: Bytes,
    pub crc32c: u32,
    pub data: Bytes,
}

impl PutItem {
    /// Bytes this item takes in a batch body.
    pub fn encoded_len(&self) -> usize {
        ITEM_HEAD + self.key.len() + self.props.len() + self.data.len()
    }
}

/// The body of a batch of `items`. Panics on an item past [`MAX_KEY`], [`MAX_PROPS`] or
/// [`MAX_ITEM_DATA`]: callers choose which items to batch.
pub fn encode_put_batch(items: &[&PutItem]) -> Bytes {
    let len = 1 + items.iter().map(|i| i.encoded_len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(VERSION);
    for item in items {
        // Lengths past their fields would shift every later field: a caller's bug, not input.
        let length = |len: usize, max: usize| {
            assert!(len <= max, "a batch item past its limit");
            len as u32
        };
        out.put_u32(item.partition);
        out.put_u16(length(item.key.len(), MAX_KEY) as u16);
        out.put_u32(length(item.props.len(), MAX_PROPS));
        out.put_u32(item.crc32c);
        out.put_u32(length(item.data.len(), MAX_ITEM_DATA));
        out.put_slice(item.key.as_bytes());
        out.put_slice(&item.props);
        out.put_slice(&item.data);
    }
    out.freeze()
}

/// The items of a batch body; their props and data are views of `body` (no copy).
pub fn decode_put_batch(body: &Bytes) -> Result<Vec<PutItem>, BatchError> {
    if body.len() > MAX_BODY {
        return Err(BatchError::TooLarge);
    }
    if body.first() != Some(&VERSION) {
        return Err(BatchError::Version);
    }
    let mut at = 1;
    let mut items = Vec::new();
    while at < body.len() {
        let n = items.len();
        if n == MAX_ITEMS {
            return Err(BatchError::TooLarge);
        }
        let head = body
            .get(at..at + ITEM_HEAD)
            .ok_or(BatchError::Truncated(n))?;
        let partition = u32::from_be_bytes(head[0..4].try_into().expect("4 bytes"));
        let key_len = usize::from(u16::from_be_bytes(head[4..6].try_into().expect("2 bytes")));
        let props_len = u32::from_be_bytes(head[6..10].try_into().expect("4 bytes")) as usize;
        let crc32c = u32::from_be_bytes(head[10..14].try_into().expect("4 bytes"));
        let data_len = u32::from_be_bytes(head[14..18].try_into().expect("4 bytes")) as usize;
        limit(n, "key", key_len, MAX_KEY)?;
        limit(n, "props", props_len, MAX_PROPS)?;
        limit(n, "data", data_len, MAX_ITEM_DATA)?;
        at += ITEM_HEAD;
        // Each length is bounded above, so these sums cannot overflow.
        let end = at + key_len + props_len + data_len;
        if end > body.len() {
            return Err(BatchError::Truncated(n));
        }
        let key = std::str::from_utf8(&body[at..at + key_len])
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or(BatchError::BadKey(n))?
            .to_owned();
        at += key_len;
        let props = body.slice(at..at + props_len);
        at += props_len;
        let data = body.slice(at..end);
        at = end;
        items.push(PutItem {
            partition,
            key,
            props,
            crc32c,
            data,
        });
    }
    Ok(items)
}

/// `len` of `field` of item `item` within `max`, or the error that names them.
pub(crate) fn limit(
    item: usize,
    field: &'static str,
    len: usize,
    max: usize,
) -> Result<(), BatchError> {
    if len > max {
        return Err(BatchError::TooLong {
            item,
            field,
            len,
            max,
        });
    }
    Ok(())
}

/// One item's answer: the status a PUT of it alone would have got, and its error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemAnswer {
    pub status: http::StatusCode,
    pub message: String,
}

/// The body of a batch's answer (messages cut to [`MAX_MESSAGE`] bytes, on a char boundary).
pub fn encode_answers(answers: &[ItemAnswer]) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + answers.len() * 4);
    out.put_u8(VERSION);
    for answer in answers {
        let mut end = answer.message.len().min(MAX_MESSAGE);
        while !answer.message.is_char_boundary(end) {
            end -= 1;
        }
        out.put_u16(answer.status.as_u16());
        out.put_u16(end as u16);
        out.put_slice(&answer.message.as_bytes()[..end]);
    }
    out.freeze()
}

/// The answers of a batch of `expected` items.
pub fn decode_answers(body: &[u8], expected: usize) -> Result<Vec<ItemAnswer>, BatchError> {
    if body.first() != Some(&VERSION) {
        return Err(BatchError::Version);
    }
    let mut at = 1;
    let mut answers = Vec::with_capacity(expected.min(MAX_ITEMS));
    while at < body.len() {
        let n = answers.len();
        if n == expected {
            return Err(BatchError::Count {
                got: n + 1,
                expected,
            });
        }
        let head = body.get(at..at + 4).ok_or(BatchError::Truncated(n))?;
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        limit(n, "message", len, MAX_MESSAGE)?;
        at += 4;
        let message = body.get(at..at + len).ok_or(BatchError::Truncated(n))?;
        at += len;
        answers.push(ItemAnswer {
            status: http::StatusCode::from_u16(code).map_err(|_| BatchError::Status(code))?,
            message: String::from_utf8_lossy(message).into_owned(),
        });
    }
    if answers.len() != expected {
        return Err(BatchError::Count {
            got: answers.len(),
            expected,
        });
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item() -> impl Strategy<Value = PutItem> {
        (
            any::<u32>(),
            "[a-zA-Z0-9_-]{1,64}",
            proptest::collection::vec(any::<u8>(), 0..200),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..3000),
        )
            .prop_map(|(partition, key, props, crc32c, data)| PutItem {
                partition,
                key,
                props: props.into(),
                crc32c,
                data: data.into(),
            })
    }

    proptest! {
        #[test]
        fn batches_round_trip(items in proptest::collection::vec(item(), 0..20)) {
            let refs: Vec<&PutItem> = items.iter().collect();
            let body = encode_put_batch(&refs);
            prop_assert_eq!(body.len(), 1 + items.iter().map(PutItem::encoded_len).sum::<usize>());
            prop_assert_eq!(decode_put_batch(&body).unwrap(), items);
        }

        #[test]
        fn answers_round_trip(answers in proptest::collection::vec((200u16..600, ".{0,40}"), 0..50)) {
            let answers: Vec<ItemAnswer> = answers
                .into_iter()
                .map(|(code, message)| ItemAnswer {
                    status: http::StatusCode::from_u16(code).unwrap(),
                    message,
                })
                .collect();
            let body = encode_answers(&answers);
            prop_assert_eq!(decode_answers(&body, answers.len()).unwrap(), answers.clone());
            if !answers.is_empty() {
                prop_assert!(decode_answers(&body, answers.len() - 1).is_err());
            }
            prop_assert!(decode_answers(&body, answers.len() + 1).is_err());
        }

        /// Any bytes: an answer or an error, never a panic, and a cut-short batch is refused.
        #[test]
        fn arbitrary_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let body = Bytes::from(bytes);
            let _ = decode_put_batch(&body);
            let _ = decode_answers(&body, 3);
        }

        #[test]
        fn a_cut_batch_is_refused(items in proptest::collection::vec(item(), 1..5), cut in 1usize..100) {
            let refs: Vec<&PutItem> = items.iter().collect();
            let body = encode_put_batch(&refs);
            let cut = cut.min(body.len() - 1);
            prop_assert!(decode_put_batch(&body.slice(..body.len() - cut)).is_err());
        }
    }

    #[test]
    fn limits_are_checked_before_lengths_are_used() {
        let mut body = vec![VERSION];
        body.extend_from_slice(&7u32.to_be_bytes());
        body.extend_from_slice(&3u16.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        body.extend_from_slice(b"abc");
        assert_eq!(
            decode_put_batch(&Bytes::from(body)),
            Err(BatchError::TooLong {
                item: 0,
                field: "data",
                len: u32::MAX as usize,
                max: MAX_ITEM_DATA
            })
        );
        let mut empty_key = vec![VERSION];
        empty_key.extend_from_slice(&[0; ITEM_HEAD]);
        assert_eq!(
            decode_put_batch(&Bytes::from(empty_key)),
            Err(BatchError::BadKey(0))
        );
        assert_eq!(decode_put_batch(&Bytes::new()), Err(BatchError::Version));
    }

    #[test]
    #[should_panic(expected = "past its limit")]
    fn an_item_past_its_limit_is_never_encoded() {
        let key = "k".repeat(MAX_KEY + 1);
        let item = PutItem {
            partition: 1,
            key,
            props: Bytes::new(),
            crc32c: 0,
            data: Bytes::new(),
        };
        encode_put_batch(&[&item]);
    }

    #[test]
    fn too_many_items_are_refused() {
        let one = PutItem {
            partition: 1,
            key: "k".into(),
            props: Bytes::new(),
            crc32c: 0,
            data: Bytes::new(),
        };
        let refs = vec![&one; MAX_ITEMS + 1];
        assert_eq!(
            decode_put_batch(&encode_put_batch(&refs)),
            Err(BatchError::TooLarge)
        );
        assert_eq!(
            decode_put_batch(&encode_put_batch(&refs[..MAX_ITEMS]))
                .unwrap()
                .len(),
            MAX_ITEMS
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let answer = ItemAnswer {
            status: http::StatusCode::BAD_REQUEST,
            message: "é".repeat(MAX_MESSAGE),
        };
        let decoded = decode_answers(&encode_answers(&[answer]), 1).unwrap();
        assert_eq!(decoded[0].message.len(), MAX_MESSAGE);
        assert!(decoded[0].message.chars().all(|c| c == 'é'));
    }
}
