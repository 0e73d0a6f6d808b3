//! Background work (compaction passes) runs in the idle I/O class: [`IdleIo::enter`] puts the
//! calling thread there (`ioprio_set`) and restores its class on drop, since these threads
//! belong to tokio's blocking pool and run other work afterwards. mq-deadline and BFQ serve
//! idle-class reads only when no other class waits (with aging, so they are never starved for
//! good); `none` ignores the class, and buffered writes are written back by the kernel's flusher
//! threads whatever the class (which is why compaction starts its own write-back in small
//! chunks).
//!
//! The CPU side is the store's: its copy loop, which holds no lock, runs under `SCHED_IDLE`
//! (`larder_store`'s `idle_cpu`); a whole pass cannot, because a thread preempted while holding
//! the index lock would stall every request behind it.

/// The calling thread's I/O class before [`IdleIo::enter`], restored on drop.
pub(crate) struct IdleIo {
    old: Option<libc::c_long>,
}

const IOPRIO_WHO_PROCESS: libc::c_long = 1;
const IOPRIO_CLASS_IDLE: libc::c_long = 3;
const IOPRIO_CLASS_SHIFT: u32 = 13;

impl IdleIo {
    pub(crate) fn enter() -> IdleIo {
        // SAFETY: plain syscalls on the calling thread (who = 0), no memory passed.
        let old = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
        let idle = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
        let set = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, idle) };
        IdleIo {
            old: (old >= 0 && set == 0).then_some(old),
        }
    }
}

impl Drop for IdleIo {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            // SAFETY: as in `enter`.
            unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, old) };
        }
    }
}
