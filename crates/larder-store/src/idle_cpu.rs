//! [`IdleCpu`]: the calling thread under Linux's `SCHED_IDLE` policy while the guard lives. It
//! then runs only when no normal thread wants the core, so compaction's copying gives the cores
//! to foreground requests.
//!
//! Only for code that holds no lock a foreground thread may wait for: an idle thread preempted
//! while holding one would stall everyone behind it for as long as the machine stays busy
//! (priority inversion; measured: 250 ms GET and PUT stalls when the whole pass ran idle, its
//! index read lock blocking the commit path's writer and every reader queued behind that).

/// The calling thread's policy before [`IdleCpu::enter`], restored on drop.
pub(crate) struct IdleCpu {
    old: Option<libc::c_int>,
}

impl IdleCpu {
    pub(crate) fn enter() -> IdleCpu {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain syscalls on the calling thread (pid 0); `param` outlives the call.
        let old = unsafe { libc::sched_getscheduler(0) };
        let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        IdleCpu {
            old: (old >= 0 && set == 0).then_some(old),
        }
    }
}

impl Drop for IdleCpu {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            // Leaving SCHED_IDLE for SCHED_OTHER needs no privilege (Linux >= 2.6.39).
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `enter`.
            unsafe { libc::sched_setscheduler(0, old, &param) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: a plain syscall on the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn the_thread_is_idle_inside_and_itself_again_after() {
        std::thread::spawn(|| {
            let before = policy();
            {
                let _idle = IdleCpu::enter();
                assert_eq!(policy(), libc::SCHED_IDLE);
            }
            assert_eq!(policy(), before);
        })
        .join()
        .unwrap();
    }
}
