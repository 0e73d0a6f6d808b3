//! Batched small GETs: many blobs asked of one storage node in one request (`GET_BATCH_PATH`),
//! and in its answer, per blob, the answer a GET of it alone would have got, or "ask alone"
//! for a blob past the size the frontend named. A frontend sends a batch only while other GETs
//! to that node are on the way (`larder-router`'s `get_batch.rs`), so that one HTTP/2 exchange
//! carries what would otherwise be dozens, each costing both sides more CPU than a small
//! blob's bytes.
//!
//! Request body: the version byte `1`, the largest blob to answer inline (4 bytes, big-endian),
//! then items one after the other until the end: partition (4 bytes), key length (2 bytes,
//! 1..=[`MAX_KEY`]), key (UTF-8). At most [`MAX_ITEMS`] items.
//!
//! Answer body (`200`): the version byte `1`, then per item, in the request's order, either
//! the byte `1` ("ask alone": the blob is larger than the request allowed, or the answer is full),
//! or the byte `0` and a GET's answer: its status (2 bytes), its header count (1 byte, at most
//! [`MAX_HEADERS`]), each header as name length (1 byte), name, value length (4 bytes, at most
//! [`MAX_HEADER_VALUE`]), value; then its body's length (4 bytes, at most [`MAX_INLINE`]) and
//! body. Decoding is one pass over the bytes, every length checked before it is used; header
//! values and bodies are views of the answer (no copy).

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::batch::{limit, BatchError};

const VERSION: u8 = 1;
/// Longest key of an item.
pub const MAX_KEY: usize = 1024;
/// Most items in one batch.
pub const MAX_ITEMS: usize = 1024;
/// Largest body of one item's answer.
pub const MAX_INLINE: usize = 1 << 20;
/// Most headers of one item's answer.
pub const MAX_HEADERS: usize = 16;
/// Longest header value of one item's answer (the properties header is the long one).
pub const MAX_HEADER_VALUE: usize = 128 * 1024;
/// Largest request body: every item at its longest key.
pub const MAX_BODY: usize = 5 + MAX_ITEMS * (6 + MAX_KEY);
/// Most bytes of answers (other than "ask alone") in one batch's answer: a node answers
/// "ask alone" to a blob whose answer would go past it.
pub const MAX_ANSWERED: usize = 1 << 20;

/// The largest answer to a batch of `items` reads.
pub fn max_answer(items: usize) -> usize {
    1 + MAX_ANSWERED + items
}

const ANSWERED: u8 = 0;
const ALONE: u8 = 1;

/// One blob asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetItem {
    pub partition: u32,
    pub key: String,
}

/// A batch: its items, and the largest blob the node may answer inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetBatch {
    pub inline_up_to: u32,
    pub items: Vec<GetItem>,
}

/// One item's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetAnswer {
    /// What a GET of the blob alone would have answered.
    Answered {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// The blob is too large for the batch: GET it alone.
    Alone,
}

impl GetAnswer {
    /// Whether every field is within its limit (stored properties past [`MAX_HEADER_VALUE`]
    /// are possible with raised header limits: such a blob is asked alone).
    pub fn encodable(&self) -> bool {
        match self {
            GetAnswer::Alone => true,
            GetAnswer::Answered { headers, body, .. } => {
                headers.len() <= MAX_HEADERS
                    && body.len() <= MAX_INLINE
                    && headers.iter().all(|(name, value)| {
                        name.as_str().len() <= usize::from(u8::MAX)
                            && value.len() <= MAX_HEADER_VALUE
                    })
            }
        }
    }

    /// Bytes this answer takes in a batch's answer.
    pub fn encoded_len(&self) -> usize {
        match self {
            GetAnswer::Alone => 1,
            GetAnswer::Answered { headers, body, .. } => {
                let headers: usize = headers
                    .iter()
                    .map(|(name, value)| 5 + name.as_str().len() + value.len())
                    .sum();
                1 + 2 + 1 + headers + 4 + body.len()
            }
        }
    }
}

/// The body of a batch asking for `items`. Panics on a key past [`MAX_KEY`] or more than
/// [`MAX_ITEMS`] items: callers choose what to batch.
pub fn encode_get_batch(inline_up_to: u32, items: &[&GetItem]) -> Bytes {
    assert!(items.len() <= MAX_ITEMS, "a GET batch past its item limit");
    let len = 5 + items.iter().map(|i| 6 + i.key.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(VERSION);
    out.put_u32(inline_up_to);
    for item in items {
        assert!(item.key.len() <= MAX_KEY, "a GET batch key past its limit");
        out.put_u32(item.partition);
        out.put_u16(item.key.len() as u16);
        out.put_slice(item.key.as_bytes());
    }
    out.freeze()
}

/// A batch from its body.
pub fn decode_get_batch(body: &[u8]) -> Result<GetBatch, BatchError> {
    if body.len() > MAX_BODY {
        return Err(BatchError::TooLarge);
    }
    if body.first() != Some(&VERSION) {
        return Err(BatchError::Version);
    }
    let inline_up_to = body.get(1..5).ok_or(BatchError::Truncated(0))?;
    let inline_up_to = u32::from_be_bytes(inline_up_to.try_into().expect("4 bytes"));
    let mut at = 5;
    let mut items = Vec::new();
    while at < body.len() {
        let n = items.len();
        if n == MAX_ITEMS {
            return Err(BatchError::TooLarge);
        }
        let head = body.get(at..at + 6).ok_or(BatchError::Truncated(n))?;
        let partition = u32::from_be_bytes(head[0..4].try_into().expect("4 bytes"));
        let key_len = usize::from(u16::from_be_bytes([head[4], head[5]]));
        limit(n, "key", key_len, MAX_KEY)?;
        at += 6;
        let key = body.get(at..at + key_len).ok_or(BatchError::Truncated(n))?;
        let key = std::str::from_utf8(key)
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or(BatchError::BadKey(n))?;
        at += key_len;
        items.push(GetItem {
            partition,
            key: key.to_owned(),
        });
    }
    Ok(GetBatch {
        inline_up_to,
        items,
    })
}

/// The body of a batch's answer. Panics on an answer that is not [`GetAnswer::encodable`]
/// (the node checks each before it answers).
pub fn encode_get_answers(answers: &[GetAnswer]) -> Bytes {
    let len = 1 + answers.iter().map(GetAnswer::encoded_len).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(VERSION);
    for answer in answers {
        let (status, headers, body) = match answer {
            GetAnswer::Alone => {
                out.put_u8(ALONE);
                continue;
            }
            GetAnswer::Answered {
                status,
                headers,
                body,
            } => (status, headers, body),
        };
        assert!(
            headers.len() <= MAX_HEADERS,
            "too many headers in a GET answer"
        );
        assert!(
            body.len() <= MAX_INLINE,
            "a GET answer's body past its limit"
        );
        out.put_u8(ANSWERED);
        out.put_u16(status.as_u16());
        out.put_u8(headers.len() as u8);
        for (name, value) in headers {
            assert!(
                value.len() <= MAX_HEADER_VALUE,
                "a header value past its limit"
            );
            // Header names of the internal API are short; `http` allows longer ones.
            assert!(
                name.as_str().len() <= usize::from(u8::MAX),
                "a header name past its limit"
            );
            out.put_u8(name.as_str().len() as u8);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(value.len() as u32);
            out.put_slice(value.as_bytes());
        }
        out.put_u32(body.len() as u32);
        out.put_slice(body);
    }
    out.freeze()
}

/// The answers of a batch of `expected` items.
pub fn decode_get_answers(body: &Bytes, expected: usize) -> Result<Vec<GetAnswer>, BatchError> {
    if body.first() != Some(&VERSION) {
        return Err(BatchError::Version);
    }
    let mut reader = Reader { body, at: 1 };
    let mut answers = Vec::with_capacity(expected.min(MAX_ITEMS));
    while reader.at < body.len() {
        let n = answers.len();
        if n == expected {
            return Err(BatchError::Count {
                got: n + 1,
                expected,
            });
        }
        answers.push(reader.answer(n)?);
    }
    if answers.len() != expected {
        return Err(BatchError::Count {
            got: answers.len(),
            expected,
        });
    }
    Ok(answers)
}

/// A position in an answer being decoded.
struct Reader<'a> {
    body: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, item: usize) -> Result<Bytes, BatchError> {
        let end = self.at.checked_add(n).ok_or(BatchError::Truncated(item))?;
        if end > self.body.len() {
            return Err(BatchError::Truncated(item));
        }
        let taken = self.body.slice(self.at..end);
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self, item: usize) -> Result<u8, BatchError> {
        Ok(self.take(1, item)?[0])
    }

    fn u16(&mut self, item: usize) -> Result<u16, BatchError> {
        let b = self.take(2, item)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, item: usize) -> Result<usize, BatchError> {
        let b = self.take(4, item)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn answer(&mut self, n: usize) -> Result<GetAnswer, BatchError> {
        match self.u8(n)? {
            ALONE => return Ok(GetAnswer::Alone),
            ANSWERED => {}
            _ => return Err(BatchError::Truncated(n)),
        }
        let code = self.u16(n)?;
        let status = StatusCode::from_u16(code).map_err(|_| BatchError::Status(code))?;
        let count = usize::from(self.u8(n)?);
        limit(n, "headers", count, MAX_HEADERS)?;
        let mut headers = HeaderMap::with_capacity(count);
        for _ in 0..count {
            let name_len = usize::from(self.u8(n)?);
            let name = header_name(&self.take(name_len, n)?).ok_or(BatchError::BadHeader(n))?;
            let value_len = self.u32(n)?;
            limit(n, "header value", value_len, MAX_HEADER_VALUE)?;
            let value = HeaderValue::from_maybe_shared(self.take(value_len, n)?)
                .map_err(|_| BatchError::BadHeader(n))?;
            headers.append(name, value);
        }
        let body_len = self.u32(n)?;
        limit(n, "body", body_len, MAX_INLINE)?;
        let body = self.take(body_len, n)?;
        Ok(GetAnswer::Answered {
            status,
            headers,
            body,
        })
    }
}

/// A header name of an answer: the names every found blob's answer carries without a copy
/// (`HeaderName::from_bytes` copies any name HTTP does not define), any other checked.
fn header_name(bytes: &[u8]) -> Option<HeaderName> {
    use crate::header_name as hn;
    for known in [hn::PROPS, hn::BLOB_SIZE, hn::CATCHING_UP] {
        if bytes == known.as_str().as_bytes() {
            return Some(known);
        }
    }
    HeaderName::from_bytes(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item() -> impl Strategy<Value = GetItem> {
        (any::<u32>(), "[a-zA-Z0-9_-]{1,64}")
            .prop_map(|(partition, key)| GetItem { partition, key })
    }

    fn answer() -> impl Strategy<Value = GetAnswer> {
        let answered = (
            200u16..600,
            proptest::collection::vec(("x-[a-z]{1,20}", "[ -~]{0,60}"), 0..5),
            proptest::collection::vec(any::<u8>(), 0..2000),
        )
            .prop_map(|(code, headers, body)| {
                let mut map = HeaderMap::new();
                for (name, value) in headers {
                    let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
                    map.append(name, HeaderValue::from_str(&value).unwrap());
                }
                GetAnswer::Answered {
                    status: StatusCode::from_u16(code).unwrap(),
                    headers: map,
                    body: body.into(),
                }
            });
        prop_oneof![Just(GetAnswer::Alone), answered]
    }

    proptest! {
        #[test]
        fn batches_round_trip(inline in any::<u32>(), items in proptest::collection::vec(item(), 0..30)) {
            let refs: Vec<&GetItem> = items.iter().collect();
            let body = encode_get_batch(inline, &refs);
            let batch = decode_get_batch(&body).unwrap();
            prop_assert_eq!(batch, GetBatch { inline_up_to: inline, items });
        }

        #[test]
        fn answers_round_trip(answers in proptest::collection::vec(answer(), 0..20)) {
            let body = encode_get_answers(&answers);
            prop_assert_eq!(body.len(), 1 + answers.iter().map(GetAnswer::encoded_len).sum::<usize>());
            prop_assert_eq!(&decode_get_answers(&body, answers.len()).unwrap(), &answers);
            if !answers.is_empty() {
                prop_assert!(decode_get_answers(&body, answers.len() - 1).is_err());
                let cut = body.slice(..body.len() - 1);
                prop_assert!(decode_get_answers(&cut, answers.len()).is_err());
            }
            prop_assert!(decode_get_answers(&body, answers.len() + 1).is_err());
        }

        /// Any bytes: a batch, answers or an error, never a panic.
        #[test]
        fn arbitrary_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let body = Bytes::from(bytes);
            let _ = decode_get_batch(&body);
            let _ = decode_get_answers(&body, 3);
        }
    }

    #[test]
    fn limits_are_checked_before_lengths_are_used() {
        let mut answer = vec![VERSION, ANSWERED, 0, 200, 0];
        answer.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            decode_get_answers(&Bytes::from(answer), 1),
            Err(BatchError::TooLong {
                item: 0,
                field: "body",
                len: u32::MAX as usize,
                max: MAX_INLINE
            })
        );
        let mut batch = vec![VERSION, 0, 0, 0, 0, 0, 0, 0, 1];
        batch.extend_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(
            decode_get_batch(&batch),
            Err(BatchError::TooLong {
                item: 0,
                field: "key",
                len: u16::MAX as usize,
                max: MAX_KEY
            })
        );
        let bad_name = Bytes::from_static(&[VERSION, ANSWERED, 0, 200, 1, 2, b' ', b'x']);
        assert!(decode_get_answers(&bad_name, 1).is_err());
        assert_eq!(decode_get_batch(&[]), Err(BatchError::Version));
        assert_eq!(
            decode_get_batch(&[VERSION, 0]),
            Err(BatchError::Truncated(0))
        );
    }

    #[test]
    fn answers_past_a_limit_are_not_encodable() {
        let mut headers = HeaderMap::new();
        let long = HeaderValue::from_maybe_shared(Bytes::from(vec![b'a'; MAX_HEADER_VALUE + 1]));
        headers.insert("x-larder-props", long.unwrap());
        let answer = |headers: HeaderMap, body: Bytes| GetAnswer::Answered {
            status: StatusCode::OK,
            headers,
            body,
        };
        assert!(!answer(headers, Bytes::new()).encodable());
        let big = Bytes::from(vec![0; MAX_INLINE + 1]);
        assert!(!answer(HeaderMap::new(), big).encodable());
        let mut many = HeaderMap::new();
        for i in 0..=MAX_HEADERS {
            many.insert(
                HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        assert!(!answer(many, Bytes::new()).encodable());
        assert!(answer(HeaderMap::new(), Bytes::from_static(b"ok")).encodable());
        assert!(max_answer(3) > MAX_ANSWERED);
    }

    #[test]
    fn too_many_items_are_refused() {
        let one = GetItem {
            partition: 1,
            key: "k".into(),
        };
        let refs = vec![&one; MAX_ITEMS];
        let mut body = encode_get_batch(0, &refs).to_vec();
        assert_eq!(decode_get_batch(&body).unwrap().items.len(), MAX_ITEMS);
        body.extend_from_slice(&[0, 0, 0, 1, 0, 1, b'k']);
        assert_eq!(decode_get_batch(&body), Err(BatchError::TooLarge));
    }
}
