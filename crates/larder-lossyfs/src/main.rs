//! `larder-lossyfs <backing-dir> <mountpoint>`: serves until killed (a power loss) or unmounted.

fn main() -> anyhow::Result<()> {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let [backing, mountpoint] = args.as_slice() else {
        anyhow::bail!("usage: larder-lossyfs <backing-dir> <mountpoint>");
    };
    // SIGUSR1 toggles a full disk. The handler only flips an atomic (async-signal-safe).
    extern "C" fn toggle_full(_: libc::c_int) {
        let full = &larder_lossyfs::FULL;
        full.store(
            !full.load(std::sync::atomic::Ordering::Relaxed),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    let handler: extern "C" fn(libc::c_int) = toggle_full;
    unsafe {
        libc::signal(libc::SIGUSR1, handler as libc::sighandler_t);
    }
    larder_lossyfs::serve(backing, mountpoint)?;
    Ok(())
}
