//! A writer's wait for its record to become durable: a runtime-agnostic completion.
//!
//! The commit thread completes it once a round's journal sync covered the record (or the record
//! was lost). An async caller awaits it as a `std::future::Future` (its task's `Waker` is woken,
//! no thread is parked); a blocking caller calls [`Completion::wait`] and parks its own thread.
//! The store depends on no async runtime.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::{self, Thread};

use parking_lot::Mutex;

use crate::types::{Error, Result};

/// How a record's wait ended.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    /// A sync covered it.
    Durable,
    /// Writing it out failed; it was cut from the log and will never be durable (an OS errno).
    Lost(i32),
    /// The disk or the store failed (a failed sync) or went away: writes are refused.
    Failed(String),
}

impl Outcome {
    pub(crate) fn lost(e: &io::Error) -> Outcome {
        Outcome::Lost(e.raw_os_error().unwrap_or(libc::EIO))
    }

    fn into_result(self) -> Result<()> {
        match self {
            Outcome::Durable => Ok(()),
            Outcome::Lost(errno) => Err(crate::segment::io_error(io::Error::from_raw_os_error(
                errno,
            ))),
            Outcome::Failed(why) => Err(Error::Unavailable(why)),
        }
    }
}

enum State {
    Pending {
        waker: Option<Waker>,
        thread: Option<Thread>,
    },
    Done(Outcome),
    /// The outcome was handed to the waiter.
    Taken,
}

/// The shared half of a completion: the log keeps one per waiting record and completes it.
#[derive(Clone)]
pub(crate) struct Completer(Arc<Mutex<State>>);

/// The waiting half, held by the writer.
pub(crate) struct Completion(Arc<Mutex<State>>);

/// A new pending completion and the handle that completes it.
pub(crate) fn pair() -> (Completer, Completion) {
    let shared = Arc::new(Mutex::new(State::Pending {
        waker: None,
        thread: None,
    }));
    (Completer(shared.clone()), Completion(shared))
}

impl Completer {
    /// Completes the wait (the first outcome wins) and wakes the waiter, task or thread.
    pub(crate) fn complete(&self, outcome: Outcome) {
        let previous = {
            let mut state = self.0.lock();
            if !matches!(*state, State::Pending { .. }) {
                return;
            }
            std::mem::replace(&mut *state, State::Done(outcome))
        };
        if let State::Pending { waker, thread } = previous {
            if let Some(waker) = waker {
                waker.wake();
            }
            if let Some(thread) = thread {
                thread.unpark();
            }
        }
    }
}

impl Completion {
    fn take(state: &mut State) -> Option<Outcome> {
        if !matches!(state, State::Done(_)) {
            return None;
        }
        match std::mem::replace(state, State::Taken) {
            State::Done(outcome) => Some(outcome),
            _ => unreachable!("checked to be done just above"),
        }
    }

    /// Parks the calling thread until the record is durable or lost.
    pub(crate) fn wait(self) -> Result<()> {
        loop {
            {
                let mut state = self.0.lock();
                if let Some(outcome) = Self::take(&mut state) {
                    return outcome.into_result();
                }
                match &mut *state {
                    State::Pending { thread, .. } => *thread = Some(thread::current()),
                    _ => return Err(Error::Unavailable("completion already taken".into())),
                }
            }
            // Park may return spuriously (or for an unpark meant for an earlier wait): loop.
            thread::park();
        }
    }
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut state = self.0.lock();
        if let Some(outcome) = Self::take(&mut state) {
            return Poll::Ready(outcome.into_result());
        }
        match &mut *state {
            State::Pending { waker, .. } => {
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            _ => Poll::Ready(Err(Error::Unavailable(
                "completion polled after it finished".into(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_thread_is_woken_with_the_outcome() {
        let (done, wait) = pair();
        let waiter = std::thread::spawn(move || wait.wait());
        std::thread::sleep(std::time::Duration::from_millis(20));
        done.complete(Outcome::Lost(libc::ENOSPC));
        done.complete(Outcome::Durable); // the first outcome wins
        assert!(matches!(waiter.join().unwrap(), Err(Error::OutOfSpace)));
    }

    #[test]
    fn a_future_is_woken_through_its_waker() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let (done, mut wait) = pair();
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        done.complete(Outcome::Durable);
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(
            Pin::new(&mut wait).poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }
}
