//! Loading config files: TOML, unknown fields refused, paths relative to the file.

use std::path::{Path, PathBuf};

use anyhow::Context;
use larder_cluster::ClusterMap;
use larder_frontend::FrontendConfig;
use larder_storage::StorageConfig;
use serde::de::DeserializeOwned;

fn load<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
}

/// Resolves `path` against the directory of `config_file` unless it is absolute.
pub fn relative_to(config_file: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base(config_file).join(path)
    }
}

fn base(config_file: &Path) -> &Path {
    config_file.parent().unwrap_or(Path::new("."))
}

pub fn storage(path: &Path) -> anyhow::Result<(StorageConfig, ClusterMap)> {
    let mut config: StorageConfig = load(path)?;
    config.cluster_map = relative_to(path, &config.cluster_map);
    config.data_dir = relative_to(path, &config.data_dir);
    if let Some(tls) = &mut config.tls {
        tls.relative_to(base(path));
    }
    if let Some(tls) = &mut config.pool.tls {
        tls.relative_to(base(path));
    }
    if let Some(secret) = &mut config.auth.secret_file {
        *secret = relative_to(path, secret);
    }
    config.store.to_options().map_err(anyhow::Error::msg)?;
    let map = ClusterMap::load(&config.cluster_map)?;
    Ok((config, map))
}

pub fn frontend(path: &Path) -> anyhow::Result<(FrontendConfig, ClusterMap)> {
    let mut config: FrontendConfig = load(path)?;
    config.cluster_map = relative_to(path, &config.cluster_map);
    if let Some(dir) = &mut config.upload_journal_dir {
        *dir = relative_to(path, dir);
    }
    if let Some(tls) = &mut config.tls {
        tls.cert = relative_to(path, &tls.cert);
        tls.key = relative_to(path, &tls.key);
    }
    if let Some(tls) = &mut config.pool.tls {
        tls.relative_to(base(path));
    }
    if let Some(secret) = &mut config.auth.secret_file {
        *secret = relative_to(path, secret);
    }
    config.validate().map_err(anyhow::Error::msg)?;
    let map = ClusterMap::load(&config.cluster_map)?;
    Ok((config, map))
}

/// The cluster secret file's name, next to the cluster map (never inside it: the map is meant
/// to be copied around, the secret only to the cluster's own hosts).
pub const SECRET_FILE: &str = "cluster.secret";

/// Writes a fresh cluster secret (mode 0600) next to `map_path` unless one is there already;
/// returns its path and whether it was written now.
pub fn ensure_secret_next_to(map_path: &Path) -> anyhow::Result<(PathBuf, bool)> {
    let path = map_path.with_file_name(SECRET_FILE);
    if path.exists() {
        return Ok((path, false));
    }
    larder_auth::generate_secret_file(&path)?;
    Ok((path, true))
}
