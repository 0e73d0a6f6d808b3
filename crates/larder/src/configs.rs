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
        config_file.parent().unwrap_or(Path::new(".")).join(path)
    }
}

pub fn storage(path: &Path) -> anyhow::Result<(StorageConfig, ClusterMap)> {
    let mut config: StorageConfig = load(path)?;
    config.cluster_map = relative_to(path, &config.cluster_map);
    config.data_dir = relative_to(path, &config.data_dir);
    config.store.to_options().map_err(anyhow::Error::msg)?;
    let map = ClusterMap::load(&config.cluster_map)?;
    Ok((config, map))
}

pub fn frontend(path: &Path) -> anyhow::Result<(FrontendConfig, ClusterMap)> {
    let mut config: FrontendConfig = load(path)?;
    config.cluster_map = relative_to(path, &config.cluster_map);
    config.validate().map_err(anyhow::Error::msg)?;
    let map = ClusterMap::load(&config.cluster_map)?;
    Ok((config, map))
}
