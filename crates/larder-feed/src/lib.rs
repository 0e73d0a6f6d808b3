//! `larder-feed`: a feed client for Vespa's `/document/v1` API (served by Larder's frontends and
//! by Vespa itself), the library behind `larder feed`; and a visit client, the library behind
//! `larder visit` ([`visit`]: parallel sliced, streamed visiting to JSON lines).
//!
//! It reads Vespa's feed format as a stream (a JSON array or JSON lines, see [`FeedReader`]) and
//! sends each operation as one HTTP/2 request over a few connections with many streams each.
//! Operations on the same document ID are applied strictly in feed order: the next is sent only
//! once the previous one, retries included, has its final answer; operations on different IDs are
//! not ordered. 429, 503 and transport errors are retried with exponential backoff and jitter
//! until the operation's deadline; a dynamic throttle ([`Throttle`]) finds the number of
//! operations in flight with the best throughput.
//!
//! ```no_run
//! # async fn example() -> Result<(), larder_feed::FeedError> {
//! let config = larder_feed::FeedConfig::new("http://127.0.0.1:8080/")?;
//! let input = std::io::BufReader::new(std::fs::File::open("feed.jsonl").unwrap());
//! let summary = larder_feed::feed(config, input).await?;
//! println!("{summary}");
//! # Ok(())
//! # }
//! ```

mod config;
mod engine;
mod operation;
mod reader;
mod stats;
mod throttle;
mod transport;
mod visit;

pub use config::{Compression, ErrorSink, FeedConfig, FeedError};
pub use engine::feed;
pub use operation::{document_path, Kind, Operation};
pub use reader::{FeedReader, Malformed};
pub use stats::{Latency, Summary};
pub use throttle::Throttle;
pub use visit::{visit, VisitConfig, VisitError, VisitSummary};
