//! Background work (compaction passes, bulk copies) runs at the lowest priority Linux has for
//! the calling thread, so that foreground requests on the same cores and disk go first.
//!
//! [`Background::enter`] puts the calling thread in the idle I/O class (`ioprio_set`) and the
//! `SCHED_IDLE` CPU policy, and restores both on drop: these threads belong to tokio's blocking
//! pool and run other work afterwards.
//!
//! - CPU: a `SCHED_IDLE` thread runs only when no normal thread of the machine wants the core
//!   (with a tiny weight, so it is never starved for good). Compaction's reads, checksums,
//!   copies and the write-back it starts with `sync_file_range` all run in this thread.
//! - I/O: mq-deadline and BFQ serve idle-class reads only when no other class waits; `none`
//!   ignores the class, and buffered writes are written back by the kernel's flusher threads
//!   whatever the class (which is why compaction starts its own write-back in small chunks).

/// The calling thread's I/O class and CPU policy before [`Background::enter`], restored on drop.
pub(crate) struct Background {
    io_class: Option<libc::c_long>,
    cpu_policy: Option<libc::c_int>,
}

const IOPRIO_WHO_PROCESS: libc::c_long = 1;
const IOPRIO_CLASS_IDLE: libc::c_long = 3;
const IOPRIO_CLASS_SHIFT: u32 = 13;

impl Background {
    pub(crate) fn enter() -> Background {
        Background {
            io_class: enter_idle_io(),
            cpu_policy: enter_idle_cpu(),
        }
    }
}

/// Returns the old class when the idle class was set. `who = 0`: the calling thread.
fn enter_idle_io() -> Option<libc::c_long> {
    // SAFETY: plain syscalls on the calling thread, no memory passed.
    let old = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    let idle = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
    let set = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, idle) };
    (old >= 0 && set == 0).then_some(old)
}

/// Returns the old policy when `SCHED_IDLE` was set (pid 0: the calling thread).
fn enter_idle_cpu() -> Option<libc::c_int> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on the calling thread; `param` outlives the call.
    let old = unsafe { libc::sched_getscheduler(0) };
    let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    (old >= 0 && set == 0).then_some(old)
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(old) = self.io_class {
            // SAFETY: as in `enter_idle_io`.
            unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, old) };
        }
        if let Some(old) = self.cpu_policy {
            // Leaving SCHED_IDLE for SCHED_OTHER needs no privilege (Linux >= 2.6.39).
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `enter_idle_cpu`.
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
                let _background = Background::enter();
                assert_eq!(policy(), libc::SCHED_IDLE);
            }
            assert_eq!(policy(), before);
        })
        .join()
        .unwrap();
    }
}
