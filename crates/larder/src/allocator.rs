//! Settings of the global allocator (mimalloc v3, through the `mimalloc` crate).
//!
//! mimalloc gives free memory back to the kernel (`madvise(MADV_DONTNEED)`) once it has been
//! free for its purge delay, 1 s by default. A server's memory use swings by more than that
//! within a second (request bodies, h2 buffers, tasks), so at request rate memory was handed back
//! and faulted in again: the kernel zeroing fresh pages (`clear_page_erms`) took 12 % of a
//! storage node's CPU under PUT load. A longer delay keeps memory that will be needed again
//! within it; a collector thread makes sure memory that stays free after a load is still given
//! back once the delay has passed, so an idle process does not keep its peak.

use std::os::raw::{c_int, c_long};
use std::time::Duration;

/// How long memory stays free before mimalloc hands it back to the kernel.
pub const PURGE_DELAY: Duration = Duration::from_secs(10);

// mimalloc's own declarations (include/mimalloc.h of the v3 sources `libmimalloc-sys` builds);
// declared here rather than through `libmimalloc-sys`' `extended` feature, which only exposes
// the same functions and none of these option numbers.
extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
    #[cfg(test)]
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_collect(force: bool);
    fn mi_version() -> c_int;
}

/// `mi_option_purge_delay` in v3's `mi_option_t` (milliseconds; -1: never purge).
const OPTION_PURGE_DELAY: c_int = 15;

/// The mimalloc major version whose option numbers are used above.
const MAJOR_VERSION: c_int = 3;

/// Applies the settings. Call first in `main`, before any other thread exists: mimalloc's
/// option setters are not thread-safe.
pub fn configure() {
    // SAFETY: plain C calls with valid arguments, made before any other thread runs.
    unsafe {
        if mi_version() / 10_000 != MAJOR_VERSION {
            // Other option numbers: leave the defaults rather than set the wrong option.
            return;
        }
        mi_option_set(OPTION_PURGE_DELAY, PURGE_DELAY.as_millis() as c_long);
    }
    // Purging happens only inside allocator calls; an idle process makes few, so without this
    // the memory freed at the end of a load could stay resident indefinitely.
    let collector = std::thread::Builder::new()
        .name("mimalloc-purge".into())
        .spawn(|| loop {
            std::thread::sleep(PURGE_DELAY);
            // SAFETY: a C call without arguments; thread-safe. `false`: purge only memory whose
            // delay has passed.
            unsafe { mi_collect(false) };
        });
    if let Err(err) = collector {
        tracing::debug!(%err, "no allocator collector thread");
    }
}

/// The purge delay in effect, in milliseconds.
#[cfg(test)]
fn purge_delay_ms() -> c_long {
    // SAFETY: a C call reading an option.
    unsafe { mi_option_get(OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option numbers above are v3's: this fails when the linked mimalloc is another major
    /// version (the `v2` feature), or when option 15 is no longer the purge delay (whose
    /// default in v3 is 1000 ms).
    #[test]
    fn the_options_are_those_of_the_linked_mimalloc() {
        // SAFETY: a C call without arguments.
        assert_eq!(unsafe { mi_version() } / 10_000, MAJOR_VERSION);
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), 1000, "v3's default purge delay");
        }
        configure();
        assert_eq!(purge_delay_ms(), PURGE_DELAY.as_millis() as c_long);
    }
}
