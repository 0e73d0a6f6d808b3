//! `larder s3 key create|revoke|list`: the S3 API's access keys, stored in the cluster. The
//! command reaches the storage nodes as a frontend does, with a frontend's config (cluster map,
//! datacenter, and the cluster secret or `[pool.tls]` certificate): whoever can run it can
//! already reach the data, and no public endpoint hands out keys.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use larder_s3::{KeyAdmin, Permission};

use crate::configs;

#[derive(Subcommand)]
pub enum S3Command {
    /// Access keys for the S3 API.
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create a key; prints its ID and secret as JSON (the only time the secret is shown).
    Create(CreateArgs),
    /// Revoke a key (within a second every frontend refuses it).
    Revoke(RevokeArgs),
    /// List the keys and their grants (not their secrets).
    List(Target),
}

#[derive(Args)]
pub struct Target {
    /// A frontend's config (`larder dev` writes `<data-dir>/frontend-dc1.toml`).
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args)]
pub struct CreateArgs {
    #[command(flatten)]
    target: Target,
    /// A grant, BUCKET:PERMISSION (permission read, write or owner; bucket `*` for all);
    /// repeatable. Owner may also create and delete the bucket.
    #[arg(long = "grant", value_parser = parse_grant, required = true)]
    grants: Vec<(String, Permission)>,
}

#[derive(Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    target: Target,
    /// The key's access key ID.
    access_key_id: String,
}

fn parse_grant(text: &str) -> Result<(String, Permission), String> {
    let (bucket, permission) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not BUCKET:PERMISSION"))?;
    if bucket.is_empty() {
        return Err(format!("{text:?} names no bucket (use * for every bucket)"));
    }
    Ok((bucket.to_owned(), permission.parse()?))
}

pub fn run(command: S3Command) -> anyhow::Result<()> {
    let S3Command::Key(command) = command;
    let target = match &command {
        KeyCommand::Create(args) => &args.target,
        KeyCommand::Revoke(args) => &args.target,
        KeyCommand::List(target) => target,
    };
    let (config, map) = configs::frontend(&target.config)?;
    crate::cli::runtime()?.block_on(async move {
        let nodes = map.nodes.iter().map(|n| (n.id.clone(), n.address));
        let credentials = config.auth.credentials().map_err(anyhow::Error::msg)?;
        let pool = larder_pool::StoragePool::new(nodes, config.pool.clone(), credentials)
            .context("connecting to the storage nodes")?;
        let router = larder_router::Router::new(
            Arc::new(map),
            pool,
            config.router.clone(),
            &config.datacenter,
        )
        .map_err(anyhow::Error::msg)?;
        let admin = KeyAdmin::new(Arc::new(router));
        match command {
            KeyCommand::Create(args) => {
                let key = admin.create(args.grants).await?;
                println!("{}", serde_json::to_string_pretty(&key)?);
            }
            KeyCommand::Revoke(args) => {
                anyhow::ensure!(
                    admin.revoke(&args.access_key_id).await?,
                    "no key {}",
                    args.access_key_id
                );
                println!("revoked {}", args.access_key_id);
            }
            KeyCommand::List(_) => {
                for (id, grants) in admin.list().await? {
                    let grants: Vec<String> =
                        grants.iter().map(|(b, p)| format!("{b}:{p:?}")).collect();
                    println!("{id}  {}", grants.join(" ").to_lowercase());
                }
            }
        }
        Ok(())
    })
}
