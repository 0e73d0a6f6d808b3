//! `larder-lossyfs <backing-dir> <mountpoint>`: serves until killed (a power loss) or unmounted.

fn main() -> anyhow::Result<()> {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let [backing, mountpoint] = args.as_slice() else {
        anyhow::bail!("usage: larder-lossyfs <backing-dir> <mountpoint>");
    };
    larder_lossyfs::serve(backing, mountpoint)?;
    Ok(())
}
